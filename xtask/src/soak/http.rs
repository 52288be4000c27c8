//! A minimal HTTP/1.1 client over one TCP connection: requests with a JSON body,
//! response heads (httparse), and bodies by length, in chunks, or to the end of the
//! connection. Enough for the soak's load and its admin and metrics calls, with
//! nothing between the bytes and what is counted.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Most response headers read.
const MAX_HEADERS: usize = 32;

/// One client connection, kept alive across requests.
#[derive(Debug)]
pub(crate) struct Connection {
    stream: TcpStream,
    /// Bytes read and not consumed yet.
    buffer: Vec<u8>,
}

/// How a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// This many bytes are left.
    Length(usize),
    /// Chunked transfer coding; this many bytes of the current chunk are left.
    Chunked(usize),
    /// The body runs to the end of the connection.
    UntilClose,
    /// The body has ended.
    Done,
}

/// A response head, with what is needed to read its body.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    framing: Framing,
    keep_alive: bool,
}

impl Response {
    /// The value of the first header called `name` (lower case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the connection may carry another request once the body is read.
    pub(crate) fn keep_alive(&self) -> bool {
        self.keep_alive && self.framing != Framing::UntilClose
    }
}

impl Connection {
    pub(crate) async fn open(addr: &str) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buffer: Vec::with_capacity(16 << 10),
        })
    }

    /// Writes one request; `headers` are extra `name: value` lines.
    pub(crate) async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<()> {
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        self.stream.write_all(&bytes).await
    }

    /// Whether the server has not closed the connection (nor sent anything unasked).
    pub(crate) fn is_open(&self) -> bool {
        let mut byte = [0_u8; 1];
        matches!(self.stream.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Reads more bytes into the buffer; the end of the connection is an
    /// `UnexpectedEof` error.
    async fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 16 << 10];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.buffer.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// Reads a response head.
    pub(crate) async fn response(&mut self) -> io::Result<Response> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut parsed = httparse::Response::new(&mut headers);
            match parsed.parse(&self.buffer) {
                Ok(httparse::Status::Complete(length)) => {
                    let response = head(&parsed)?;
                    self.buffer.drain(..length);
                    return Ok(response);
                }
                Ok(httparse::Status::Partial) => self.fill().await?,
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
        }
    }

    /// The next piece of `response`'s body, `None` once it has ended.
    pub(crate) async fn next_piece(
        &mut self,
        response: &mut Response,
    ) -> io::Result<Option<Vec<u8>>> {
        loop {
            match response.framing {
                Framing::Done | Framing::Length(0) => {
                    response.framing = Framing::Done;
                    return Ok(None);
                }
                Framing::Chunked(0) => {
                    let size = self.chunk_size().await?;
                    if size == 0 {
                        self.trailers().await?;
                        response.framing = Framing::Done;
                        return Ok(None);
                    }
                    response.framing = Framing::Chunked(size);
                }
                Framing::Length(left) | Framing::Chunked(left) => {
                    if self.buffer.is_empty() {
                        self.fill().await?;
                    }
                    let n = left.min(self.buffer.len());
                    let piece: Vec<u8> = self.buffer.drain(..n).collect();
                    response.framing = match response.framing {
                        Framing::Length(_) => Framing::Length(left - n),
                        _ => Framing::Chunked(left - n),
                    };
                    return Ok(Some(piece));
                }
                Framing::UntilClose => {
                    if self.buffer.is_empty() {
                        match self.fill().await {
                            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                                response.framing = Framing::Done;
                                return Ok(None);
                            }
                            other => other?,
                        }
                    }
                    return Ok(Some(std::mem::take(&mut self.buffer)));
                }
            }
        }
    }

    /// The whole body of `response`.
    pub(crate) async fn body(&mut self, response: &mut Response) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        while let Some(piece) = self.next_piece(response).await? {
            body.extend_from_slice(&piece);
        }
        Ok(body)
    }

    /// Reads one line (without its CRLF).
    async fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\r\n") {
                let line = self.buffer[..end].to_vec();
                self.buffer.drain(..end + 2);
                return Ok(line);
            }
            self.fill().await?;
        }
    }

    /// Reads the CRLF ending the previous chunk, if any, and the next chunk's size.
    async fn chunk_size(&mut self) -> io::Result<usize> {
        let mut line = self.line().await?;
        if line.is_empty() {
            line = self.line().await?;
        }
        let text = String::from_utf8_lossy(&line);
        let digits = text.split(';').next().unwrap_or_default().trim();
        usize::from_str_radix(digits, 16).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Reads the trailer section after the last chunk.
    async fn trailers(&mut self) -> io::Result<()> {
        while !self.line().await?.is_empty() {}
        Ok(())
    }
}

/// The head of a parsed response.
fn head(parsed: &httparse::Response<'_, '_>) -> io::Result<Response> {
    let status = parsed
        .code
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no status"))?;
    let headers: Vec<(String, String)> = parsed
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let value = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.to_ascii_lowercase())
    };
    let framing = if value("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        Framing::Chunked(0)
    } else if let Some(length) = value("content-length") {
        Framing::Length(
            length
                .trim()
                .parse()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
        )
    } else if status == 204 || status == 304 {
        Framing::Done
    } else {
        Framing::UntilClose
    };
    let keep_alive = parsed.version == Some(1) && value("connection").is_none_or(|v| v != "close");
    Ok(Response {
        status,
        headers,
        framing,
        keep_alive,
    })
}

/// One request on a fresh connection: the status and the whole body.
pub(crate) async fn call(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<(u16, Vec<u8>)> {
    let mut connection = Connection::open(addr).await?;
    let mut all = vec![("connection", "close")];
    all.extend_from_slice(headers);
    connection.send(method, path, &all, body).await?;
    let mut response = connection.response().await?;
    let body = connection.body(&mut response).await?;
    Ok((response.status, body))
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    use super::*;

    /// Serves `replies` one after another on one connection, each cut into 3-byte
    /// writes, after reading whatever the client sent.
    async fn server(replies: &'static [&'static str]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            for reply in replies {
                let mut request = [0u8; 1024];
                let _ = socket.read(&mut request).await.unwrap();
                for piece in reply.as_bytes().chunks(3) {
                    socket.write_all(piece).await.unwrap();
                    socket.flush().await.unwrap();
                }
            }
        });
        addr
    }

    #[tokio::test]
    async fn chunked_and_sized_answers_share_a_kept_alive_connection() {
        let addr = server(&[
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Switchyard-Engine: E1\r\n\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n",
            "HTTP/1.1 502 Bad Gateway\r\ncontent-length: 4\r\n\r\noops",
        ])
        .await;
        let mut connection = Connection::open(&addr).await.unwrap();
        connection.send("POST", "/", &[], b"{}").await.unwrap();
        let mut response = connection.response().await.unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-switchyard-engine"), Some("E1"));
        assert_eq!(
            connection.body(&mut response).await.unwrap(),
            b"hello, world"
        );
        assert!(response.keep_alive());
        connection.send("POST", "/", &[], b"{}").await.unwrap();
        let mut response = connection.response().await.unwrap();
        assert_eq!(response.status, 502);
        assert_eq!(connection.body(&mut response).await.unwrap(), b"oops");
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_and_one_without_framing_runs_to_the_close() {
        let addr = server(&["HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel"]).await;
        let mut connection = Connection::open(&addr).await.unwrap();
        connection.send("POST", "/", &[], b"{}").await.unwrap();
        let mut response = connection.response().await.unwrap();
        let error = connection.body(&mut response).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        let addr = server(&["HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it"]).await;
        let (status, body) = call(&addr, "GET", "/", &[], b"").await.unwrap();
        assert_eq!((status, body.as_slice()), (200, b"all of it".as_slice()));
    }
}
