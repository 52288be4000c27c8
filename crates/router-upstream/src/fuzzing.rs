//! The response decoder over bytes, as the client runs it over a socket: the
//! entry point of the cargo-fuzz target `h1_response` (feature `fuzzing`) and of the
//! corpus replay test; and a whole exchange over an in-memory pipe ([`exchange`]),
//! the entry point of the target `h1_exchange`.

use bytes::BytesMut;
use http::StatusCode;

use crate::h1::{Decoder, H1Error, parse_head};

mod exchange;
pub use exchange::{Exchange, MOST_BUFFERED, check_exchange, exchange, exchange_in_reads};

/// A response decoded from bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The final (non-interim) status.
    pub status: StatusCode,
    /// The body bytes delivered.
    pub body: Vec<u8>,
    /// Whether the body ended as its framing says, with nothing left over.
    pub complete: bool,
}

/// Decodes `wire` as the client does when the socket delivers it in reads cut at
/// `cuts` (offsets, taken modulo the length). The input ends as if the engine closed
/// the connection.
///
/// # Errors
/// The head or the body framing is malformed.
pub fn decode_response(wire: &[u8], cuts: &[usize]) -> Result<Decoded, H1Error> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    cuts.push(wire.len());
    cuts.sort_unstable();
    let mut reads = cuts.windows(2).map(|w| &wire[w[0]..w[1]]);
    let mut buf = BytesMut::from(&wire[..cuts[0]]);
    let head = loop {
        if let Some(head) = parse_head(&mut buf)? {
            break head;
        }
        match reads.next() {
            Some(read) => buf.extend_from_slice(read),
            None => return Err(H1Error::Closed),
        }
    };
    let mut decoder = Decoder::new(head.framing);
    let mut body = Vec::new();
    loop {
        let mut out = BytesMut::new();
        decoder.decode(&mut buf, &mut out)?;
        body.extend_from_slice(&out);
        if !out.is_empty() {
            continue;
        }
        match reads.next() {
            Some(read) => buf.extend_from_slice(read),
            None => break,
        }
    }
    if decoder == Decoder::Close {
        decoder = Decoder::Done;
    }
    Ok(Decoded {
        status: head.parts.status,
        body,
        complete: decoder == Decoder::Done && buf.is_empty(),
    })
}

#[cfg(test)]
mod tests;
