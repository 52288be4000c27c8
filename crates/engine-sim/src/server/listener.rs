//! The accept loop of an HTTP listener: HTTP/1.1 connections served by a router until
//! stopped, the listener closed while the refuse-connections fault is on.

use std::net::SocketAddr;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Accepts HTTP connections until stopped, then drops every open connection. While
/// `refusing` is on, the listener is closed so connections are refused, then bound
/// again.
pub(crate) async fn serve_http(
    listener: TcpListener,
    addr: SocketAddr,
    app: axum::Router,
    mut refusing: Option<watch::Receiver<bool>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut listener = Some(listener);
    let mut connections = JoinSet::new();
    loop {
        if refusing.as_mut().is_some_and(|r| *r.borrow_and_update()) {
            listener = None;
        } else if listener.is_none() {
            match TcpListener::bind(addr).await {
                Ok(l) => listener = Some(l),
                Err(e) => tracing::warn!(error = %e, %addr, "re-binding the HTTP listener failed"),
            }
        }
        tokio::select! {
            accepted = accept(listener.as_ref()) => match accepted {
                Ok((stream, _)) => {
                    drop(stream.set_nodelay(true));
                    let service = TowerToHyperService::new(app.clone());
                    connections.spawn(async move {
                        let connection = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service);
                        drop(connection.await);
                    });
                }
                Err(e) => tracing::warn!(error = %e, "accept failed"),
            },
            _ = refusal_changed(&mut refusing) => {}
            _ = stop.wait_for(|s| *s) => return,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn refusal_changed(refusing: &mut Option<watch::Receiver<bool>>) {
    let changed = match refusing {
        Some(r) => r.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await;
    }
}

async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}
