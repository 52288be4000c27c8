//! A response body read straight from the engine's socket by whichever task polls
//! it. Every poll forwards all the body bytes that have arrived as one frame, so a
//! burst of server-sent events becomes one write to the client, not one per event.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::{H1Error, Pool, Stream};
use crate::url::Origin;
use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

/// The most body bytes gathered into one frame.
const MAX_FRAME: usize = 64 << 10;
/// The longest chunk-size line (size, extensions) or trailer section accepted.
const MAX_LINE: usize = 4 << 10;
/// The most bytes one poll reads: a peer whose bytes decode to little (long chunk
/// extensions) must not hold a runtime worker for as long as it keeps sending.
const MAX_READ_PER_POLL: usize = 256 << 10;

/// How the body's end is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// `content-length` bytes.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
    /// Everything until the engine closes the connection.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decoder {
    Length(u64),
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk, with this many data bytes left.
    Data(u64),
    /// Expecting the CRLF that ends a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one (bytes seen so far).
    Trailers(usize),
    Close,
    Done,
}

impl Decoder {
    pub(crate) fn new(framing: Framing) -> Self {
        match framing {
            Framing::Length(0) => Self::Done,
            Framing::Length(n) => Self::Length(n),
            Framing::Chunked => Self::Size,
            Framing::Close => Self::Close,
        }
    }

    /// Moves decoded body bytes from `buf` to `out` until `buf` runs dry, the body
    /// ends, or `out` is full.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut, out: &mut BytesMut) -> Result<(), H1Error> {
        while out.len() < MAX_FRAME {
            match *self {
                Self::Length(left) | Self::Data(left) => {
                    if buf.is_empty() {
                        return Ok(());
                    }
                    let take = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    out.extend_from_slice(&buf[..take]);
                    buf.advance(take);
                    let left = left - take as u64;
                    *self = match (*self, left) {
                        (Self::Length(_), 0) => Self::Done,
                        (Self::Length(_), left) => Self::Length(left),
                        (_, 0) => Self::DataEnd,
                        (_, left) => Self::Data(left),
                    };
                }
                Self::Size => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(());
                    };
                    let size = chunk_size(&line)?;
                    *self = if size == 0 {
                        Self::Trailers(0)
                    } else {
                        Self::Data(size)
                    };
                }
                Self::DataEnd => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(());
                    };
                    if !line.is_empty() {
                        return Err(H1Error::Malformed("chunk data longer than its size"));
                    }
                    *self = Self::Size;
                }
                Self::Trailers(seen) => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(());
                    };
                    let seen = seen + line.len() + 2;
                    *self = if line.is_empty() {
                        Self::Done
                    } else if seen > MAX_LINE {
                        return Err(H1Error::Malformed("trailer section too large"));
                    } else {
                        Self::Trailers(seen)
                    };
                }
                Self::Close => {
                    let take = buf.len().min(MAX_FRAME - out.len());
                    out.extend_from_slice(&buf[..take]);
                    buf.advance(take);
                    if buf.is_empty() {
                        return Ok(());
                    }
                }
                Self::Done => return Ok(()),
            }
        }
        Ok(())
    }
}

/// What a poll of the body returns.
type Polled = Poll<Option<Result<Frame<Bytes>, H1Error>>>;

/// The connection a body is read from, and where it goes back when the body ends.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) stream: Stream,
    pub(super) pool: Arc<Pool>,
    pub(super) origin: Origin,
    pub(super) keep_alive: bool,
}

/// An engine's response body, read from the engine's socket by the task that polls
/// it: every poll forwards all the body bytes that have arrived as one frame. Read
/// to its end with nothing left over, its connection goes back to the pool; dropped
/// early, the connection is closed (which is how an engine learns the client left).
#[derive(Debug)]
pub struct H1Body {
    conn: Option<Conn>,
    buf: BytesMut,
    decoder: Decoder,
    fault: Fault,
}

/// Whether the body broke, and whether it has said so yet.
#[derive(Debug)]
enum Fault {
    None,
    /// To report after the body bytes decoded before it.
    Pending(H1Error),
    /// Reported: nothing more comes.
    Reported,
}

impl H1Body {
    pub(super) fn new(conn: Conn, buf: BytesMut, framing: Framing) -> Self {
        let mut body = Self {
            conn: Some(conn),
            buf,
            decoder: Decoder::new(framing),
            fault: Fault::None,
        };
        if body.decoder == Decoder::Done {
            body.finish();
        }
        body
    }

    /// The body broke: the connection is closed, and `error` is reported after the
    /// bytes decoded before it.
    fn fail(&mut self, out: BytesMut, error: H1Error) -> Polled {
        self.conn = None;
        if out.is_empty() {
            self.fault = Fault::Reported;
            Poll::Ready(Some(Err(error)))
        } else {
            self.fault = Fault::Pending(error);
            Poll::Ready(Some(Ok(Frame::data(out.freeze()))))
        }
    }

    /// The body is complete: the connection goes back to the pool if it can carry
    /// another request (nothing unread on it, no `connection: close`).
    fn finish(&mut self) {
        self.decoder = Decoder::Done;
        if let Some(conn) = self.conn.take()
            && conn.keep_alive
            && self.buf.is_empty()
        {
            conn.pool.put(conn.origin, conn.stream);
        }
    }
}

/// One CRLF-terminated line without its terminator, or `None` until it is complete.
fn take_line(buf: &mut BytesMut) -> Result<Option<BytesMut>, H1Error> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(end) if end > MAX_LINE => Err(H1Error::Malformed("chunk line too long")),
        Some(end) => {
            let line = buf.split_to(end);
            buf.advance(2);
            Ok(Some(line))
        }
        // A line of MAX_LINE bytes may wait for the LF after its CR.
        None if buf.len() > MAX_LINE + 1 => Err(H1Error::Malformed("chunk line too long")),
        None => Ok(None),
    }
}

/// The hexadecimal size of a chunk-size line (RFC 9112 section 7.1): hex digits
/// (leading zeros allowed, at most 15 significant), then optionally spaces or tabs
/// and `;` chunk extensions, which are ignored. Anything else (leading whitespace,
/// a bare CR or LF, trailing garbage) is refused.
fn chunk_size(line: &[u8]) -> Result<u64, H1Error> {
    let invalid = || H1Error::Malformed("invalid chunk size");
    let digits = match line.iter().position(|b| *b == b';') {
        Some(at) => {
            let size = &line[..at];
            let end = size
                .iter()
                .rposition(|b| !matches!(b, b' ' | b'\t'))
                .map_or(0, |i| i + 1);
            &size[..end]
        }
        None => line,
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err(invalid());
    }
    let significant = &digits[digits.iter().take_while(|b| **b == b'0').count()..];
    if significant.len() > 15 || line.iter().any(|b| matches!(b, b'\r' | b'\n')) {
        return Err(invalid());
    }
    Ok(significant.iter().fold(0_u64, |size, digit| {
        let value = char::from(*digit).to_digit(16).unwrap_or_default();
        size * 16 + u64::from(value)
    }))
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = H1Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        if !matches!(this.fault, Fault::None) {
            return match std::mem::replace(&mut this.fault, Fault::Reported) {
                Fault::Pending(e) => Poll::Ready(Some(Err(e))),
                _ => Poll::Ready(None),
            };
        }
        let mut out = BytesMut::new();
        let mut read = 0;
        loop {
            if let Err(e) = this.decoder.decode(&mut this.buf, &mut out) {
                return this.fail(out, e);
            }
            if this.decoder == Decoder::Done {
                this.finish();
                return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(out.freeze()))));
            }
            if out.len() >= MAX_FRAME {
                return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if read >= MAX_READ_PER_POLL {
                if out.is_empty() {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
            }
            this.buf.reserve(16 << 10);
            match conn.stream.poll_read_buf(cx, &mut this.buf) {
                Poll::Ready(Ok(0)) if this.decoder == Decoder::Close => {
                    this.decoder = Decoder::Done;
                }
                Poll::Ready(Ok(0)) => return this.fail(out, H1Error::Closed),
                Poll::Ready(Ok(n)) => read += n,
                Poll::Ready(Err(e)) => return this.fail(out, H1Error::Io(e)),
                // All that has arrived goes on now; the task is woken for more.
                Poll::Pending if !out.is_empty() => {
                    return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder == Decoder::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder {
            Decoder::Length(left) => SizeHint::with_exact(left),
            Decoder::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
