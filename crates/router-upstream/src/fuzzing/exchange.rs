//! A whole exchange over any byte stream: the client writes its request and reads
//! the answer with the same head parser and body decoder, in the same order, as it
//! does over an engine's socket (`h1::exchange`, then `H1Body`). Over an in-memory
//! pipe the engine's bytes arrive in the reads a fuzzer chooses.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Decoded, decode_response};
use crate::h1::{Decoder, H1Error, MAX_HEAD, parse_head, request_head};

/// The most bytes the client ever holds undecoded between reads: a head up to its
/// limit (a longer one is refused); a body holds less (a chunk line or trailer
/// section, at most 4 KiB).
pub const MOST_BUFFERED: usize = MAX_HEAD;

/// What an exchange gave, and the most bytes it held undecoded between reads.
#[derive(Debug)]
pub struct Exchange {
    /// The answer, or why there is none.
    pub outcome: Result<Decoded, H1Error>,
    /// The most bytes held undecoded between reads.
    pub most_buffered: usize,
}

/// Sends `GET /x` over `stream` and reads the answer until its body ends: the end
/// of the stream ends a close-delimited body and fails any other.
pub async fn exchange<S>(mut stream: S) -> Exchange
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut most_buffered = 0;
    let outcome = answer(&mut stream, &mut most_buffered).await;
    Exchange {
        outcome,
        most_buffered,
    }
}

async fn answer<S>(stream: &mut S, most_buffered: &mut usize) -> Result<Decoded, H1Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let request = request_head("GET", "engine", "/x", &[], 0);
    stream.write_all(&request).await.map_err(H1Error::Io)?;
    let mut buf = BytesMut::with_capacity(8 << 10);
    let head = loop {
        if let Some(head) = parse_head(&mut buf)? {
            break head;
        }
        *most_buffered = (*most_buffered).max(buf.len());
        if stream.read_buf(&mut buf).await.map_err(H1Error::Io)? == 0 {
            return Err(H1Error::Closed);
        }
    };
    let mut decoder = Decoder::new(head.framing);
    let mut body = Vec::new();
    loop {
        let mut out = BytesMut::new();
        decoder.decode(&mut buf, &mut out)?;
        body.extend_from_slice(&out);
        *most_buffered = (*most_buffered).max(buf.len());
        if decoder == Decoder::Done {
            break;
        }
        // A full frame: decode on before reading more, as the body does.
        if !out.is_empty() && !buf.is_empty() {
            continue;
        }
        if stream.read_buf(&mut buf).await.map_err(H1Error::Io)? == 0 {
            if decoder == Decoder::Close {
                break;
            }
            return Err(H1Error::Closed);
        }
    }
    Ok(Decoded {
        status: head.parts.status,
        body,
        complete: buf.is_empty(),
    })
}

/// Runs [`exchange`] over an in-memory pipe whose other end reads the request and
/// then writes `wire` in pieces of `read` bytes (at least one), one piece per read
/// of the client, and closes.
///
/// # Panics
/// The runtime for the pipe cannot be built.
pub fn exchange_in_reads(wire: &[u8], read: usize) -> Exchange {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let (client, mut engine) = tokio::io::duplex(64 << 10);
    let engine = async move {
        let mut request = Vec::new();
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match engine.read_buf(&mut request).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        for piece in wire.chunks(read.max(1)) {
            // The client stops reading at an error or the body's end.
            if engine.write_all(piece).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    runtime.block_on(async { tokio::join!(engine, exchange(client)).1 })
}

/// The `h1_exchange` fuzz target's checks of one input: the first byte is the read
/// size, the rest the engine's answer. The exchange holds at most
/// [`MOST_BUFFERED`] bytes undecoded, and an answer it accepts is the one
/// [`decode_response`] gives for the same bytes in the same reads.
///
/// # Panics
/// When a check fails.
pub fn check_exchange(input: &[u8]) {
    let Some((&read, wire)) = input.split_first() else {
        return;
    };
    let read = usize::from(read.max(1));
    let exchanged = exchange_in_reads(wire, read);
    assert!(
        exchanged.most_buffered <= MOST_BUFFERED,
        "{} bytes held undecoded",
        exchanged.most_buffered
    );
    if let Ok(answer) = exchanged.outcome {
        let cuts: Vec<usize> = (read..wire.len()).step_by(read).collect();
        let decoded = decode_response(wire, &cuts).expect("the same bytes decode");
        assert_eq!(
            (decoded.status, &decoded.body),
            (answer.status, &answer.body),
            "the exchange and the decoder agree"
        );
    }
}
