//! The HTTP/1.1 client for requests to engines, with a pool of keep-alive
//! connections per engine.
//!
//! A response body is read from the socket by the task that relays it, not handed
//! over chunk by chunk from a separate connection task: each burst of bytes from the
//! engine costs one read and is forwarded as one frame.

mod body;
#[cfg(test)]
mod differential;
#[cfg(test)]
mod rfc9112;
mod stream;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, Write as _};
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, Version, header};
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::Instant;

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use body::Decoder;
pub use body::H1Body;
use body::{Conn, Framing};
pub(crate) use stream::Stream;

#[cfg(feature = "tls")]
use crate::tls::EngineTls;
use crate::url::Origin;

/// The largest response head accepted.
pub(crate) const MAX_HEAD: usize = 64 << 10;
/// The most response header fields accepted.
const MAX_HEADERS: usize = 128;

/// Why a request to an engine failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum H1Error {
    /// The TCP connection could not be made.
    #[error("connection failed: {0}")]
    Connect(io::Error),
    /// The TCP connection, and over TLS the handshake, were not done within the
    /// connect timeout.
    #[error("connect timeout")]
    ConnectTimeout,
    /// The TLS handshake failed (an engine certificate not trusted, or not for the
    /// URL's host), or the engine refused the connection with a TLS alert before
    /// reading the request: it never read the request.
    #[error("TLS handshake failed: {0}")]
    Tls(io::Error),
    /// A new connection broke before the request was written (the engine reset it):
    /// the engine never read the request.
    #[error("the connection broke before the request was written: {0}")]
    NotWritten(io::Error),
    /// Reading or writing the connection failed.
    #[error("{0}")]
    Io(io::Error),
    /// The engine closed the connection before its response was complete.
    #[error("the engine closed the connection before the response was complete")]
    Closed,
    /// The engine's response is not valid HTTP/1.1.
    #[error("malformed response: {0}")]
    Malformed(&'static str),
}

/// Idle connections to one engine, each with the time it went idle, oldest first.
type IdleConns = VecDeque<(Stream, Instant)>;

/// Idle keep-alive connections per engine origin.
#[derive(Debug)]
struct Pool {
    idle: Mutex<HashMap<Origin, IdleConns>>,
    max_idle_per_host: usize,
    idle_timeout: Duration,
}

impl Pool {
    /// Whether a connection idle since `since` may still be used at `now`.
    fn fresh(&self, since: Instant, now: Instant) -> bool {
        now.duration_since(since) < self.idle_timeout
    }

    fn put(&self, origin: Origin, stream: Stream) {
        if self.max_idle_per_host == 0 {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.lock();
        let conns = idle.entry(origin).or_default();
        while conns
            .front()
            .is_some_and(|(_, since)| !self.fresh(*since, now))
            || conns.len() >= self.max_idle_per_host
        {
            conns.pop_front();
        }
        conns.push_back((stream, now));
    }

    /// The most recently used idle connection that is still open.
    fn take(&self, origin: &Origin) -> Option<Stream> {
        let now = Instant::now();
        let mut idle = self.idle.lock();
        let conns = idle.get_mut(origin)?;
        while let Some((mut stream, since)) = conns.pop_back() {
            if self.fresh(since, now) && stream.is_open() {
                return Some(stream);
            }
        }
        None
    }

    /// Closes connections idle for longer than the idle timeout.
    fn prune(&self) {
        let now = Instant::now();
        self.idle.lock().retain(|_, conns| {
            conns.retain(|(_, since)| self.fresh(*since, now));
            !conns.is_empty()
        });
    }
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub(crate) struct H1Client {
    pool: Arc<Pool>,
    connect_timeout: Duration,
    /// How `https://` engines are reached; without it they cannot be.
    #[cfg(feature = "tls")]
    tls: Option<EngineTls>,
}

impl H1Client {
    /// A client keeping at most `max_idle_per_host` connections per engine, each for
    /// at most `idle_timeout` (keep it below the engines' own keep-alive timeout).
    pub(crate) fn new(
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_idle_per_host: usize,
    ) -> Self {
        Self {
            pool: Arc::new(Pool {
                idle: Mutex::default(),
                max_idle_per_host,
                idle_timeout,
            }),
            connect_timeout,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// The client reaching `https://` engines with `tls`.
    #[cfg(feature = "tls")]
    pub(crate) fn with_tls(self, tls: EngineTls) -> Self {
        Self {
            tls: Some(tls),
            ..self
        }
    }

    /// Closes connections idle for longer than the idle timeout.
    pub(crate) fn prune_idle(&self) {
        self.pool.prune();
    }

    /// Sends `method path` to `origin` with `headers` and `body` and returns once the
    /// response head has arrived.
    ///
    /// A pooled connection the engine closed while it sat idle is replaced by a new
    /// connection once: when writing the request failed, or, for a GET, when the
    /// connection ended before any byte of an answer. A POST that was written is never
    /// sent twice: the engine may be working on it.
    pub(crate) async fn request(
        &self,
        method: &str,
        origin: &Origin,
        path: &str,
        headers: &[(HeaderName, &HeaderValue)],
        body: &Bytes,
    ) -> Result<Response<H1Body>, H1Error> {
        let head = request_head(method, origin.authority(), path, headers, body.len());
        if let Some(stream) = self.pool.take(origin) {
            match exchange(stream, &head, body).await {
                Ok(exchanged) => return Ok(self.response(exchanged, origin)),
                Err(failure) if !failure.sent || (method == "GET" && !failure.received) => {}
                Err(failure) => return Err(failure.error),
            }
        }
        let stream = self.connect(origin).await?;
        match exchange(stream, &head, body).await {
            Ok(exchanged) => Ok(self.response(exchanged, origin)),
            Err(Failure {
                error: H1Error::Io(e),
                sent: false,
                ..
            }) => Err(H1Error::NotWritten(e)),
            #[cfg(feature = "tls")]
            Err(Failure {
                error: H1Error::Io(e),
                received: false,
                ..
            }) if crate::tls::refused(&e) => Err(H1Error::Tls(e)),
            Err(failure) => Err(failure.error),
        }
    }

    /// A new connection to `origin`: TCP, then over TLS the handshake, all within
    /// the connect timeout.
    async fn connect(&self, origin: &Origin) -> Result<Stream, H1Error> {
        tokio::time::timeout(self.connect_timeout, self.open(origin))
            .await
            .map_err(|_| H1Error::ConnectTimeout)?
    }

    async fn open(&self, origin: &Origin) -> Result<Stream, H1Error> {
        let tcp = TcpStream::connect(origin.authority())
            .await
            .map_err(H1Error::Connect)?;
        tcp.set_nodelay(true).map_err(H1Error::Connect)?;
        if !origin.is_tls() {
            return Ok(Stream::Plain(tcp));
        }
        self.secure(origin, tcp).await
    }

    #[cfg(feature = "tls")]
    async fn secure(&self, origin: &Origin, tcp: TcpStream) -> Result<Stream, H1Error> {
        let tls = self.tls.as_ref().ok_or_else(|| {
            H1Error::Tls(io::Error::other(
                "this client has no TLS settings for https:// engines",
            ))
        })?;
        let stream = tls.connect(origin, tcp).await.map_err(H1Error::Tls)?;
        Ok(Stream::Tls(Box::new(stream)))
    }

    #[cfg(not(feature = "tls"))]
    async fn secure(&self, _: &Origin, _: TcpStream) -> Result<Stream, H1Error> {
        Err(H1Error::Tls(io::Error::other(
            "this build has no TLS for https:// engines",
        )))
    }

    fn response(&self, exchanged: Exchanged, origin: &Origin) -> Response<H1Body> {
        let conn = Conn {
            stream: exchanged.stream,
            pool: Arc::clone(&self.pool),
            origin: origin.clone(),
            keep_alive: exchanged.head.keep_alive,
        };
        let body = H1Body::new(conn, exchanged.buf, exchanged.head.framing);
        Response::from_parts(exchanged.head.parts, body)
    }
}

pub(crate) fn request_head(
    method: &str,
    authority: &str,
    path: &str,
    headers: &[(HeaderName, &HeaderValue)],
    body_len: usize,
) -> Vec<u8> {
    let mut head = Vec::with_capacity(96 + authority.len() + path.len() + headers.len() * 40);
    for part in [method, " ", path, " HTTP/1.1\r\nhost: ", authority, "\r\n"] {
        head.extend_from_slice(part.as_bytes());
    }
    for (name, value) in headers {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if body_len > 0 || method != "GET" {
        // Writing to a Vec cannot fail.
        let _ = write!(head, "content-length: {body_len}\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// A connection whose request was sent and whose response head was read.
struct Exchanged {
    stream: Stream,
    head: Head,
    /// Bytes read past the head: the start of the body.
    buf: BytesMut,
}

/// A failed exchange: whether the request had been written, and whether any byte of
/// an answer had arrived.
struct Failure {
    error: H1Error,
    sent: bool,
    received: bool,
}

async fn exchange(mut stream: Stream, head: &[u8], body: &[u8]) -> Result<Exchanged, Failure> {
    let failed = |error, received| Failure {
        error,
        sent: true,
        received,
    };
    let mut buf = BytesMut::with_capacity(8 << 10);
    // A request whose writing failed was not read whole by the engine, so it may be
    // sent again on a fresh connection.
    let written = write_request(&mut stream, head, body, &mut buf)
        .await
        .map_err(|e| Failure {
            error: H1Error::Io(e),
            sent: false,
            received: false,
        })?;
    let mut received = !buf.is_empty();
    loop {
        if let Some(mut head) = parse_head(&mut buf).map_err(|e| failed(e, true))? {
            // An answer that came before the whole request was written leaves the
            // connection in no state for another request.
            head.keep_alive &= written == Written::Whole;
            return Ok(Exchanged { stream, head, buf });
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) => return Err(failed(H1Error::Closed, received)),
            Ok(_) => received = true,
            Err(e) => return Err(failed(H1Error::Io(e), received)),
        }
    }
}

/// How much of a request was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// All of it.
    Whole,
    /// Part of it: the engine answered first (say, a 413 for a body it will not
    /// read), and its answer is in the buffer.
    Interrupted,
}

/// Writes the request (and over TLS flushes it) while watching for an early answer:
/// whatever the engine sends while the writing waits stops the writing and lands in
/// `buf`.
async fn write_request(
    stream: &mut Stream,
    mut head: &[u8],
    mut body: &[u8],
    buf: &mut BytesMut,
) -> io::Result<Written> {
    std::future::poll_fn(|cx| {
        loop {
            if let Poll::Ready(sent) = poll_send(stream, cx, &mut head, &mut body) {
                return Poll::Ready(sent.map(|()| Written::Whole));
            }
            match ready!(stream.poll_read_buf(cx, buf)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into())),
                Ok(_) if answering(buf) => return Poll::Ready(Ok(Written::Interrupted)),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    })
    .await
}

/// Writes what is left of `head` and `body`, then flushes it; pending while the
/// engine takes no more.
fn poll_send(
    stream: &mut Stream,
    cx: &mut Context<'_>,
    head: &mut &[u8],
    body: &mut &[u8],
) -> Poll<io::Result<()>> {
    while !head.is_empty() || !body.is_empty() {
        let written =
            ready!(stream.poll_write_vectored(cx, &[IoSlice::new(head), IoSlice::new(body)]))?;
        if written == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        let from_head = written.min(head.len());
        *head = &head[from_head..];
        *body = &body[written - from_head..];
    }
    stream.poll_flush(cx)
}

/// Whether `buf` holds the start of the engine's final answer (or of something that
/// is no answer). Complete interim (1xx) answers at its front are dropped: an engine
/// may invite the rest of the request with a 100 (Continue) nobody asked for, and
/// the writing goes on (RFC 9110 section 15.2). So does it while a head is partial.
fn answering(buf: &mut BytesMut) -> bool {
    loop {
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut fields);
        match parsed.parse(buf) {
            Ok(httparse::Status::Complete(len)) if matches!(parsed.code, Some(100 | 102..=199)) => {
                buf.advance(len);
            }
            Ok(httparse::Status::Partial) => return buf.len() > MAX_HEAD,
            _ => return true,
        }
    }
}

/// A parsed response head.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) parts: http::response::Parts,
    pub(crate) framing: Framing,
    pub(crate) keep_alive: bool,
}

/// Parses and removes a complete response head from `buf`, skipping interim (1xx)
/// responses; `None` until the head is complete.
pub(crate) fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, H1Error> {
    loop {
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut fields);
        let len = match parsed.parse(buf) {
            Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => {
                return Err(H1Error::Malformed("response head too large"));
            }
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(H1Error::Malformed("response head too large"));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(H1Error::Malformed("invalid response head")),
        };
        let status = parsed
            .code
            .filter(|code| (100..=599).contains(code))
            .and_then(|code| StatusCode::from_u16(code).ok())
            .ok_or(H1Error::Malformed("status outside 100-599"))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(H1Error::Malformed("unexpected protocol switch"));
        }
        if status.is_informational() {
            buf.advance(len);
            continue;
        }
        let mut response = Response::new(());
        *response.status_mut() = status;
        *response.version_mut() = if parsed.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        let headers = response.headers_mut();
        for field in parsed.headers.iter() {
            let name = HeaderName::from_bytes(field.name.as_bytes())
                .map_err(|_| H1Error::Malformed("invalid header name"))?;
            let value = HeaderValue::from_bytes(field.value)
                .map_err(|_| H1Error::Malformed("invalid header value"))?;
            headers.append(name, value);
        }
        let (parts, ()) = response.into_parts();
        let framing = framing(status, parts.version, &parts.headers)?;
        // A length beside a transfer coding is ignored, and such a connection is not
        // trusted with another request (RFC 9112 sections 6.1 and 6.3).
        let ambiguous = parts.headers.contains_key(header::TRANSFER_ENCODING)
            && parts.headers.contains_key(header::CONTENT_LENGTH);
        let keep_alive =
            framing != Framing::Close && !ambiguous && keeps_alive(parts.version, &parts.headers);
        buf.advance(len);
        return Ok(Some(Head {
            parts,
            framing,
            keep_alive,
        }));
    }
}

/// How the body's end is found (RFC 9112 section 6.3). This client asks for no
/// transfer coding but chunked, so any other is refused rather than passed on. A
/// transfer coding in an HTTP/1.0 answer makes its framing faulty (section 6.1),
/// and a user agent discards an answer with faulty framing (section 6.3).
fn framing(status: StatusCode, version: Version, headers: &HeaderMap) -> Result<Framing, H1Error> {
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok(Framing::Length(0));
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        if version == Version::HTTP_10 {
            return Err(H1Error::Malformed(
                "transfer coding in an HTTP/1.0 response",
            ));
        }
        let mut codings = tokens(headers, header::TRANSFER_ENCODING);
        return match (codings.next(), codings.next()) {
            (Some(coding), None) if coding.eq_ignore_ascii_case("chunked") => Ok(Framing::Chunked),
            _ => Err(H1Error::Malformed("unsupported transfer coding")),
        };
    }
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        let value = value
            .to_str()
            .map_err(|_| H1Error::Malformed("invalid content-length"))?;
        for token in value.split(',').map(str::trim) {
            if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
                return Err(H1Error::Malformed("invalid content-length"));
            }
            let token: u64 = token
                .parse()
                .map_err(|_| H1Error::Malformed("invalid content-length"))?;
            if length.is_some_and(|l| l != token) {
                return Err(H1Error::Malformed("conflicting content-length"));
            }
            length = Some(token);
        }
    }
    Ok(length.map_or(Framing::Close, Framing::Length))
}

/// Whether the connection persists after this answer (RFC 9112 section 9.3): never
/// with a `close` option, whatever else the fields say; by default in HTTP/1.1; in
/// HTTP/1.0 only with `keep-alive`.
fn keeps_alive(version: Version, headers: &HeaderMap) -> bool {
    let has =
        |token: &str| tokens(headers, header::CONNECTION).any(|t| t.eq_ignore_ascii_case(token));
    !has("close") && (version == Version::HTTP_11 || has("keep-alive"))
}

/// The comma-separated tokens of every `name` field.
fn tokens(headers: &HeaderMap, name: HeaderName) -> impl Iterator<Item = &str> {
    headers
        .get_all(name)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}
