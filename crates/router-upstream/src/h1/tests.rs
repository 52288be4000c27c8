use std::sync::atomic::Ordering;
use std::time::Duration;

use http_body_util::BodyExt;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;

use super::body::Decoder;
use super::testing::{client, get, plain, scripted};
use super::*;

/// A bound on every network wait, so a client or engine that hangs fails the test.
const GUARD: Duration = Duration::from_secs(10);

/// `body` in chunks of the given sizes, with an extension on every other chunk-size
/// line and a trailer when `trailer` is set.
fn chunked(body: &[u8], sizes: &[usize], trailer: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = body;
    let mut sizes = sizes.iter().cycle();
    let mut n = 0;
    while !rest.is_empty() {
        let size = (*sizes.next().unwrap_or(&1)).clamp(1, rest.len());
        let ext = if n % 2 == 1 { ";name=value" } else { "" };
        out.extend_from_slice(format!("{size:x}{ext}\r\n").as_bytes());
        out.extend_from_slice(&rest[..size]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[size..];
        n += 1;
    }
    out.extend_from_slice(b"0\r\n");
    if trailer {
        out.extend_from_slice(b"x-trailer: 1\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Feeds `wire` to a decoder in pieces cut at `cuts`; the decoded bytes, and
/// whether the decoder saw the end with nothing left over.
fn decode_in_pieces(framing: Framing, wire: &[u8], cuts: &[usize]) -> (Vec<u8>, bool) {
    let mut decoder = Decoder::new(framing);
    let mut buf = BytesMut::new();
    let mut decoded = Vec::new();
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    cuts.push(wire.len());
    cuts.sort_unstable();
    let mut at = 0;
    for cut in cuts {
        buf.extend_from_slice(&wire[at..cut]);
        at = cut;
        let mut out = BytesMut::new();
        decoder.decode(&mut buf, &mut out).expect("valid framing");
        decoded.extend_from_slice(&out);
    }
    (decoded, decoder == Decoder::Done && buf.is_empty())
}

proptest! {
    #[test]
    fn chunked_bodies_decode_whatever_the_reads(
        body in proptest::collection::vec(any::<u8>(), 0..600),
        sizes in proptest::collection::vec(1_usize..80, 1..6),
        trailer in any::<bool>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let wire = chunked(&body, &sizes, trailer);
        let (decoded, done) = decode_in_pieces(Framing::Chunked, &wire, &cuts);
        prop_assert_eq!(decoded, body);
        prop_assert!(done);
    }

    #[test]
    fn length_bodies_decode_whatever_the_reads(
        body in proptest::collection::vec(any::<u8>(), 1..600),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let (decoded, done) = decode_in_pieces(Framing::Length(body.len() as u64), &body, &cuts);
        prop_assert_eq!(decoded, body);
        prop_assert!(done);
    }
}

#[test]
fn every_chunk_already_received_is_forwarded_in_one_frame() {
    let events: Vec<u8> = (0..11)
        .flat_map(|i| format!("data: {{\"n\":{i}}}\n\n").into_bytes())
        .collect();
    let wire = chunked(&events, &[16], false);
    let mut decoder = Decoder::new(Framing::Chunked);
    let mut buf = BytesMut::from(&wire[..]);
    let mut out = BytesMut::new();
    decoder.decode(&mut buf, &mut out).unwrap();
    assert_eq!(&out[..], &events[..], "one decode call, one frame");
    assert_eq!(decoder, Decoder::Done);
}

#[test]
fn malformed_chunk_framing_is_an_error() {
    for wire in [
        &b"zz\r\nab\r\n0\r\n\r\n"[..],
        b"\r\n",
        b"2\r\nabc\r\n0\r\n\r\n",
        b"1000000000000000\r\n",
    ] {
        let mut buf = BytesMut::from(wire);
        let result = Decoder::new(Framing::Chunked).decode(&mut buf, &mut BytesMut::new());
        assert!(
            matches!(result, Err(H1Error::Malformed(_))),
            "{wire:?}: {result:?}"
        );
    }
    let mut trailers = BytesMut::from(&b"0\r\n"[..]);
    for _ in 0..1000 {
        trailers.extend_from_slice(b"x-trailer: 1\r\n");
    }
    assert!(
        matches!(
            Decoder::new(Framing::Chunked).decode(&mut trailers, &mut BytesMut::new()),
            Err(H1Error::Malformed("trailer section too large"))
        ),
        "trailers are bounded in total, not only per line"
    );
    let mut endless = BytesMut::from(&[b'1'; 8 << 10][..]);
    assert!(
        Decoder::new(Framing::Chunked)
            .decode(&mut endless, &mut BytesMut::new())
            .is_err(),
        "a size line that never ends"
    );
}

#[test]
fn heads_give_framing_and_keep_alive() {
    let head = |text: &str| parse_head(&mut BytesMut::from(text));
    let parsed = head("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!(
        (parsed.parts.status, parsed.framing, parsed.keep_alive),
        (StatusCode::OK, Framing::Length(5), true),
        "an interim response is skipped"
    );
    let parsed = head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!(
        (parsed.framing, parsed.keep_alive),
        (Framing::Chunked, false)
    );
    assert!(
        matches!(
            head("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n"),
            Err(H1Error::Malformed("unsupported transfer coding"))
        ),
        "a coding this client never asked for is not passed on as content"
    );
    assert!(
        matches!(
            head("HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"),
            Err(H1Error::Malformed(
                "transfer coding in an HTTP/1.0 response"
            ))
        ),
        "HTTP/1.0 knows no transfer coding: the framing is faulty"
    );
    for length in ["+5", "", "5 5", "-1"] {
        assert!(
            matches!(
                head(&format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {length}\r\n\r\n"
                )),
                Err(H1Error::Malformed(_))
            ),
            "content-length {length:?}"
        );
    }
    let parsed = head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 4\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!(
        (parsed.framing, parsed.keep_alive),
        (Framing::Chunked, false),
        "a length beside chunked is ignored and the connection not reused"
    );
    let parsed = head("HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
    assert_eq!((parsed.framing, parsed.keep_alive), (Framing::Close, false));
    let parsed = head("HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!(parsed.framing, Framing::Length(0));
    assert!(
        head("HTTP/1.1 200 OK\r\ncontent-length: 5")
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n"),
        Err(H1Error::Malformed("conflicting content-length"))
    ));
    assert!(matches!(
        head("SMTP ready\r\n\r\n"),
        Err(H1Error::Malformed(_))
    ));
}

#[tokio::test]
async fn connections_are_reused_and_a_closed_idle_one_is_replaced() {
    let (origin, connections) = scripted::<&[u8], _>(vec![
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            true,
        ),
        (b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n", false),
    ])
    .await;
    let client = client();
    assert_eq!(get(&client, &origin).await.unwrap().1, "ok");
    assert_eq!(get(&client, &origin).await.unwrap().1, "ok");
    assert_eq!(connections.load(Ordering::SeqCst), 1, "kept alive");
    // The server closed the connection after the second answer; the pooled
    // connection is found closed (or fails before any byte) and replaced.
    let (status, body) = get(&client, &origin).await.unwrap();
    assert_eq!((status, body.len()), (StatusCode::CREATED, 0));
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_second_connection_is_served_while_the_first_is_held() {
    let (origin, connections) = scripted::<&[u8], _>(vec![
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n",
            false,
        ),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecond", false),
    ])
    .await;
    let client = client();
    let held = timeout(
        GUARD,
        client.request("GET", &origin, "/x", &[], &Bytes::new()),
    )
    .await
    .expect("the first head in time")
    .unwrap();
    let mut held = held.into_body();
    let first = timeout(GUARD, held.frame())
        .await
        .expect("the first chunk in time");
    assert_eq!(first.unwrap().unwrap().into_data().unwrap(), "first");
    // The first body is unfinished, so its connection is busy: the second request
    // opens another, which the engine answers while the first stays open.
    let (status, body) = timeout(GUARD, get(&client, &origin))
        .await
        .expect("the second connection is served while the first is held")
        .unwrap();
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"second"[..]));
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn close_delimited_and_truncated_bodies() {
    let (origin, _) = scripted::<&[u8], _>(vec![
        (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", true),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf", true),
    ])
    .await;
    let client = client();
    assert_eq!(get(&client, &origin).await.unwrap().1, "until the end");
    assert!(matches!(get(&client, &origin).await, Err(H1Error::Closed)));
}

#[tokio::test]
async fn refused_connections_and_garbage_answers_are_errors() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed = plain(listener.local_addr().unwrap());
    drop(listener);
    assert!(matches!(
        get(&client(), &closed).await,
        Err(H1Error::Connect(_))
    ));
    let (origin, _) = scripted::<&[u8], _>(vec![(b"garbage\r\n\r\n", true)]).await;
    assert!(matches!(
        get(&client(), &origin).await,
        Err(H1Error::Malformed(_))
    ));
}

#[tokio::test]
async fn a_written_post_is_never_sent_twice_but_a_get_is_retried() {
    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let (origin, connections) = scripted::<&[u8], _>(vec![
        (OK, false),
        (b"", true),
        (OK, false),
        (b"", true),
        (OK, false),
    ])
    .await;
    let client = client();
    assert_eq!(get(&client, &origin).await.unwrap().1, "ok");
    let post = client
        .request("POST", &origin, "/x", &[], &Bytes::from_static(b"{}"))
        .await;
    assert!(matches!(post, Err(H1Error::Closed)), "{post:?}");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "the POST was not resent"
    );
    assert_eq!(get(&client, &origin).await.unwrap().1, "ok");
    assert_eq!(connections.load(Ordering::SeqCst), 2);
    assert_eq!(get(&client, &origin).await.unwrap().1, "ok");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        3,
        "the GET was resent once"
    );
}

#[tokio::test]
async fn bytes_before_a_framing_error_are_delivered_first() {
    let (origin, _) = scripted::<&[u8], _>(vec![(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
        true,
    )])
    .await;
    let response = client()
        .request("GET", &origin, "/x", &[], &Bytes::new())
        .await
        .unwrap();
    let mut body = response.into_body();
    let mut data = Vec::new();
    let error = loop {
        match body.frame().await {
            Some(Ok(frame)) => data.extend_from_slice(&frame.into_data().unwrap()),
            Some(Err(e)) => break e,
            None => panic!("the body ended without its error"),
        }
    };
    assert_eq!(data, b"hello");
    assert!(matches!(error, H1Error::Malformed("invalid chunk size")));
    assert!(body.frame().await.is_none(), "nothing after the error");
}

#[tokio::test]
async fn connections_with_leftovers_or_dropped_bodies_are_not_reused() {
    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let (origin, connections) = scripted::<&[u8], _>(vec![
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA",
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
            false,
        ),
        (OK, false),
    ])
    .await;
    let client = client();
    assert_eq!(get(&client, &origin).await.unwrap().1, "ok");
    let partial = client
        .request("GET", &origin, "/x", &[], &Bytes::new())
        .await
        .unwrap();
    assert_eq!(
        connections.load(Ordering::SeqCst),
        2,
        "stray bytes after a body: not reused"
    );
    drop(partial);
    assert_eq!(get(&client, &origin).await.unwrap().1, "ok");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        3,
        "a body dropped midway closes its connection"
    );
}

#[tokio::test]
async fn an_answer_that_comes_before_the_body_is_written_is_read() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = plain(listener.local_addr().unwrap());
    let (done, hold) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut chunk = [0_u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut chunk).await.unwrap();
            request.extend_from_slice(&chunk[..n]);
        }
        // Answer at once and read none of the body, as an engine refusing it does.
        socket
            .write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 9\r\n\r\ntoo large")
            .await
            .unwrap();
        drop(hold.await);
    });
    let body = Bytes::from(vec![b'x'; 32 << 20]);
    let response = client()
        .request("POST", &origin, "/x", &[], &body)
        .await
        .expect("the early answer");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let text = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(text, "too large");
    drop(done);
}

#[tokio::test]
async fn a_connection_reset_before_the_request_was_written_says_so() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = plain(listener.local_addr().unwrap());
    let engine = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        // The request has begun arriving; closing with unread bytes resets the
        // connection while the rest is still being written.
        let mut first = [0_u8; 1];
        stream.read_exact(&mut first).await.unwrap();
        drop(stream);
    });
    let body = Bytes::from(vec![b'x'; 64 << 20]);
    let result = timeout(GUARD, client().request("POST", &origin, "/", &[], &body))
        .await
        .expect("no hang");
    assert!(
        matches!(result, Err(H1Error::NotWritten(_))),
        "{:?}",
        result.map(|r| r.status())
    );
    engine.await.unwrap();
}
