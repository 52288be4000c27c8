//! A connection to an engine: plain TCP, or TLS over TCP (feature `tls`). The
//! client reads and writes through these few calls, whichever it is.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

/// See the module documentation.
#[derive(Debug)]
pub(crate) enum Stream {
    /// Plain TCP, read and written through readiness, one system call a read.
    Plain(TcpStream),
    /// TLS over TCP.
    #[cfg(feature = "tls")]
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    /// Reads what has arrived into `buf` (0 at the end of the stream); pending, with
    /// the task woken when more comes, when nothing has.
    pub(crate) fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        match self {
            Self::Plain(tcp) => loop {
                match tcp.try_read_buf(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        ready!(tcp.poll_read_ready(cx))?;
                    }
                    read => return Poll::Ready(read),
                }
            },
            #[cfg(feature = "tls")]
            Self::Tls(tls) => crate::tls::poll_read_buf(tls, cx, buf),
        }
    }

    /// [`poll_read_buf`](Self::poll_read_buf) as a future.
    pub(crate) async fn read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_read_buf(cx, buf)).await
    }

    /// Writes from `bufs` in order; how many bytes were taken.
    pub(crate) fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self {
            Self::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            #[cfg(feature = "tls")]
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    /// Sends what the TLS layer holds back (plain TCP holds nothing back).
    pub(crate) fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Self::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            #[cfg(feature = "tls")]
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    /// Whether an idle connection is usable: reading it would wait (no end of
    /// stream, no stray bytes, and over TLS no alert).
    pub(crate) fn is_open(&mut self) -> bool {
        match self {
            Self::Plain(tcp) => {
                let mut probe = [0_u8; 1];
                matches!(tcp.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            #[cfg(feature = "tls")]
            Self::Tls(tls) => crate::tls::is_open(tls),
        }
    }
}
