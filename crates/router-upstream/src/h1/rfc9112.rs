//! The message-framing and connection-reuse cases of RFC 9112 as one table, each
//! answer served by a real engine socket to the real client. After each answer a
//! second request shows whether the connection was reused: it arrives on the same
//! connection or on a new one.
//!
//! Decisions where the RFC leaves a choice:
//! - `transfer-encoding` beside `content-length` (§6.3 rule 3): the body is chunked
//!   and the connection is not reused (§6.1: "ought to be handled as an error").
//! - `transfer-encoding` in an HTTP/1.0 answer is refused: §6.1 says to treat its
//!   framing as faulty, and faulty framing received by a user agent means closing
//!   the connection and discarding the answer (§6.3 rule 5).
//! - A transfer coding other than a single `chunked` is refused: `chunked` twice is
//!   forbidden (§6.1); with another coding after `chunked` the body runs until the
//!   close (§6.3 rule 3) but is still transfer-coded, and this client asks for no
//!   coding it could remove.
//! - 204 and 304 have no body (§6.3 rule 1); bytes sent as one are left over, and a
//!   connection with bytes left over is not reused.
//! - A chunk size may have any number of leading zeros (`1*HEXDIG`, bounded by the
//!   line limit) but at most 15 significant digits.
//! - A status outside 100-599 is an error (RFC 9110 §15: treat it as a 5xx; the
//!   relay answers a malformed response as a bad gateway).
//! - Interim 1xx answers are skipped (RFC 9110 §15.2); a 101 is an error, since this
//!   client never asks for an upgrade.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::testing::{Then, client, get, plain, scripted};

/// What the client makes of an answer.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The request failed (head or body).
    Refused,
    /// The status, the body, and whether the connection carried the next request.
    Answer(u16, &'static [u8], bool),
}

/// After the answer, the engine keeps the connection (`Open`), closes it (`Close`),
/// or writes these bytes on it unasked once the client is done with the answer.
#[derive(Debug, Clone, Copy)]
enum After {
    Open,
    Close,
    Unsolicited(&'static [u8]),
}

struct Row {
    name: &'static str,
    wire: &'static [u8],
    after: After,
    expected: Outcome,
}

const fn row(name: &'static str, wire: &'static [u8], after: After, expected: Outcome) -> Row {
    Row {
        name,
        wire,
        after,
        expected,
    }
}

use After::{Close, Open, Unsolicited};
use Outcome::{Answer, Refused};

const HELLO: &[u8] = b"hello";

#[rustfmt::skip]
const ROWS: &[Row] = &[
    row("content-length body", b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", Open, Answer(200, HELLO, true)),
    row("transfer-encoding beside content-length: chunked, not reused",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Open, Answer(200, HELLO, false)),
    row("content-length beside transfer-encoding: chunked, not reused",
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Open, Answer(200, HELLO, false)),
    row("transfer-encoding in an HTTP/1.0 answer",
        b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Open, Refused),
    row("transfer-encoding and content-length in an HTTP/1.0 answer",
        b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Open, Refused),
    row("chunked twice in one field", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Open, Refused),
    row("chunked in two fields",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Open, Refused),
    row("chunked not final", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\nhello", Close, Refused),
    row("a coding other than chunked", b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nhello", Close, Refused),
    row("chunked in capitals", b"HTTP/1.1 200 OK\r\ntransfer-encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Open, Answer(200, HELLO, true)),
    row("204 with a body", b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello", Open, Answer(204, b"", false)),
    row("304 with a chunked body", b"HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Open, Answer(304, b"", false)),
    row("304 with the length of what it stands for", b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n", Open, Answer(304, b"", true)),
    row("204 with content-length 0", b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n", Open, Answer(204, b"", true)),
    row("content-length 5, 5", b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\nhello", Open, Answer(200, HELLO, true)),
    row("content-length 5 in two fields", b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\nhello", Open, Answer(200, HELLO, true)),
    row("content-length 5, 6", b"HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\nhello", Open, Refused),
    row("content-length 5 and 6 in two fields", b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello", Open, Refused),
    row("content-length +5", b"HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nhello", Open, Refused),
    row("content-length beyond u64", b"HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551616\r\n\r\nhello", Open, Refused),
    row("content-length with leading zeros", b"HTTP/1.1 200 OK\r\ncontent-length: 005\r\n\r\nhello", Open, Answer(200, HELLO, true)),
    row("chunk size with 20 leading zeros",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n000000000000000000005\r\nhello\r\n0\r\n\r\n", Open, Answer(200, HELLO, true)),
    row("chunk size with 16 significant digits",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1000000000000000\r\nhello\r\n0\r\n\r\n", Open, Refused),
    row("quoted chunk extension holding a semicolon",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;name=\"a;b\"\r\nhello\r\n0;x=\"\\\"\"\r\n\r\n", Open, Answer(200, HELLO, true)),
    row("whitespace before a chunk extension",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5 \t;name=value\r\nhello\r\n0\r\n\r\n", Open, Answer(200, HELLO, true)),
    row("bare CR in a chunk-size line",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r;x\r\nhello\r\n0\r\n\r\n", Open, Refused),
    row("bare LF ending a chunk-size line",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", Open, Refused),
    row("whitespace before a chunk size",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n", Open, Refused),
    row("whitespace after a chunk size",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n", Open, Refused),
    row("chunk data longer than its size",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nhello\r\n0\r\n\r\n", Open, Refused),
    row("obs-fold in trailers",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-trailer: a\r\n  b\r\n\r\n", Open, Answer(200, HELLO, true)),
    row("connection: close, keep-alive", b"HTTP/1.1 200 OK\r\nconnection: close, keep-alive\r\ncontent-length: 5\r\n\r\nhello", Open, Answer(200, HELLO, false)),
    row("HTTP/1.0 with connection: keep-alive, close",
        b"HTTP/1.0 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 5\r\n\r\nhello", Open, Answer(200, HELLO, false)),
    row("HTTP/1.0 with connection: keep-alive and connection: close",
        b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\nconnection: close\r\ncontent-length: 5\r\n\r\nhello", Open, Answer(200, HELLO, false)),
    row("HTTP/1.0 with connection: keep-alive", b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 5\r\n\r\nhello", Open, Answer(200, HELLO, true)),
    row("HTTP/1.0 without keep-alive", b"HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\nhello", Open, Answer(200, HELLO, false)),
    row("close-delimited body", b"HTTP/1.1 200 OK\r\n\r\nhello", Close, Answer(200, HELLO, false)),
    row("close-delimited body despite keep-alive", b"HTTP/1.1 200 OK\r\nconnection: keep-alive\r\n\r\nhello", Close, Answer(200, HELLO, false)),
    row("length body cut short", b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nhello", Close, Refused),
    row("chunked body cut short", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n", Close, Refused),
    row("bytes after the body", b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\n\r\n", Open, Answer(200, HELLO, false)),
    row("unsolicited bytes on an idle connection", b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
        Unsolicited(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nsplit"), Answer(200, HELLO, false)),
    row("status 600", b"HTTP/1.1 600 Odd\r\ncontent-length: 5\r\n\r\nhello", Open, Refused),
    row("status 099", b"HTTP/1.1 099 Odd\r\ncontent-length: 5\r\n\r\nhello", Open, Refused),
    row("status 599", b"HTTP/1.1 599 Odd\r\ncontent-length: 5\r\n\r\nhello", Open, Answer(599, HELLO, true)),
    row("100 Continue before the final head",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", Open, Answer(200, HELLO, true)),
    row("several interim answers, one with fields",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
        Open, Answer(200, HELLO, true)),
    row("101 Switching Protocols", b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n", Open, Refused),
    row("an interim answer and then the close", b"HTTP/1.1 100 Continue\r\n\r\n", Close, Refused),
];

/// The answer to every second request.
const SECOND: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecond";

/// A bound on every network wait, so a client that hangs fails its row.
const GUARD: Duration = Duration::from_secs(10);

/// The status, body and reuse the client observed, or `None` for an error.
type Observed = Option<(u16, Bytes, bool)>;

async fn run(row: &Row) -> Observed {
    let (go, go_rx) = oneshot::channel();
    let (done_tx, done) = oneshot::channel();
    let then = match row.after {
        Open => Then::KeepOpen,
        Close => Then::Close,
        Unsolicited(bytes) => Then::Unsolicited {
            bytes,
            go: go_rx,
            done: done_tx,
        },
    };
    let (origin, connections) = scripted(vec![(row.wire, then), (SECOND, Then::KeepOpen)]).await;
    let client = client();
    let first = tokio::time::timeout(GUARD, get(&client, &origin))
        .await
        .unwrap_or_else(|_| panic!("{}: no outcome", row.name));
    if matches!(row.after, Unsolicited(_)) {
        go.send(()).expect("the engine waits for the word");
        done.await.expect("the unsolicited bytes were written");
    }
    let second = tokio::time::timeout(GUARD, get(&client, &origin))
        .await
        .unwrap_or_else(|_| panic!("{}: no second answer", row.name));
    assert_eq!(
        second.map(|(_, body)| body).ok(),
        Some(Bytes::from_static(b"second")),
        "{}: the next request is answered",
        row.name
    );
    let reused = connections.load(Ordering::SeqCst) == 1;
    match first {
        Err(_) => {
            assert!(
                !reused,
                "{}: a failed exchange's connection was reused",
                row.name
            );
            None
        }
        Ok((status, body)) => Some((status.as_u16(), body, reused)),
    }
}

fn matches(expected: &Outcome, observed: &Observed) -> bool {
    match (expected, observed) {
        (Refused, None) => true,
        (Answer(status, body, reused), Some(seen)) => {
            (*status, *body, *reused) == (seen.0, &seen.1[..], seen.2)
        }
        _ => false,
    }
}

#[tokio::test]
async fn rfc9112_framing_and_reuse() {
    let mut failures = Vec::new();
    for row in ROWS {
        let outcome = run(row).await;
        if !matches(&row.expected, &outcome) {
            failures.push(format!(
                "{}: expected {:?}, got {:?}",
                row.name, row.expected, outcome
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An engine may send a 100 (Continue) nobody asked for while the request body is
/// still on its way (RFC 9110 §15.2: a client must parse 1xx answers it did not
/// expect). The upload goes on: the engine reads the whole body before it answers.
#[tokio::test]
async fn an_unasked_interim_answer_does_not_stop_the_upload() {
    const BODY: usize = 32 << 20;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = plain(listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut chunk = vec![0_u8; 64 << 10];
        let head_end = loop {
            let n = socket.read(&mut chunk).await.unwrap();
            request.extend_from_slice(&chunk[..n]);
            if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
        };
        socket
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .unwrap();
        let mut body = request.len() - head_end;
        while body < BODY {
            let n = socket.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the body stopped after {body} bytes");
            body += n;
        }
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nreceived")
            .await
            .unwrap();
    });
    let body = Bytes::from(vec![b'x'; BODY]);
    let client = client();
    let post = async {
        let response = client.request("POST", &origin, "/x", &[], &body).await?;
        let status = response.status();
        let text = http_body_util::BodyExt::collect(response.into_body()).await?;
        Ok::<_, super::H1Error>((status, text.to_bytes()))
    };
    let (status, text) = tokio::time::timeout(GUARD, post)
        .await
        .expect("the final answer, after the whole body")
        .unwrap();
    assert_eq!((status, &text[..]), (StatusCode::OK, &b"received"[..]));
}
