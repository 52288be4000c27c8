//! The floor of the end-to-end benchmark: a minimal HTTP/1.1 pass-through proxy
//! (hyper server and pooled keep-alive client, TCP_NODELAY both ways, no parsing).
//! Whatever a router adds beyond this is the cost of routing.
//!
//! Usage: passthrough LISTEN_ADDR UPSTREAM_BASE_URL (prints the bound address).

#![allow(
    clippy::print_stdout,
    reason = "prints its bound address for the benchmark driver"
)]

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

type ProxyBody = BoxBody<Bytes, hyper::Error>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let listen: SocketAddr = args.next().ok_or("missing LISTEN_ADDR")?.parse()?;
    let upstream: Uri = args.next().ok_or("missing UPSTREAM_BASE_URL")?.parse()?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    let listener = TcpListener::bind(listen).await?;
    println!("{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let (client, upstream) = (client.clone(), upstream.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let (client, upstream) = (client.clone(), upstream.clone());
                async move { forward(&client, &upstream, request).await }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn forward(
    client: &Client<HttpConnector, Incoming>,
    upstream: &Uri,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("{}{}", upstream.to_string().trim_end_matches('/'), path)
        .parse()
        .expect("a valid URI");
    match client.request(Request::from_parts(parts, body)).await {
        Ok(response) => Ok(response.map(BodyExt::boxed)),
        Err(_) => {
            let mut response = Response::new(
                http_body_util::Empty::<Bytes>::new()
                    .map_err(|never| match never {})
                    .boxed(),
            );
            *response.status_mut() = hyper::StatusCode::BAD_GATEWAY;
            Ok(response)
        }
    }
}
