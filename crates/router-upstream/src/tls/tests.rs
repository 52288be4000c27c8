//! TLS to engines over real TLS on loopback: a throwaway authority signs the
//! engines' (and the router's) certificates.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::net::TcpListener;

use super::testing::{After, Engine, Pki, engine, tls_config};
use super::*;
use crate::{Upstream, UpstreamError, UpstreamTimeouts};

/// A bound on every network wait, so a client or engine that hangs fails the test.
const GUARD: Duration = Duration::from_secs(10);

fn timeouts() -> UpstreamTimeouts {
    UpstreamTimeouts {
        connect: Duration::from_secs(2),
        first_byte: Duration::from_secs(5),
        pool_idle: Duration::from_secs(60),
    }
}

/// A client trusting the system's authorities and those of `files`.
fn upstream(files: &TlsFiles) -> Upstream {
    Upstream::new(timeouts()).with_tls(EngineTls::load(files).expect("usable TLS files"))
}

fn trusting(pki: &Pki) -> TlsFiles {
    TlsFiles {
        ca_file: Some(pki.ca_file()),
        ..TlsFiles::default()
    }
}

fn base(engine: &Engine, scheme: &str) -> String {
    format!("{scheme}://{}", engine.address)
}

/// `POST /v1/completions` to `base`: the status and the body.
async fn post(upstream: &Upstream, base: &str) -> Result<(StatusCode, Bytes), UpstreamError> {
    let origin = Origin::of(base).expect("an engine URL");
    let body = Bytes::from_static(br#"{"prompt":"hi"}"#);
    let exchange = async {
        let response = upstream
            .post(&origin, "/v1/completions", &[], &body)
            .await?;
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(GUARD, exchange)
        .await
        .expect("an answer in time")
}

#[tokio::test]
async fn an_https_engine_is_reached_with_the_ca_file_configured() {
    let pki = Pki::new("reached");
    let server = pki.issue("engine", &["127.0.0.1"]);
    let engine = engine(Some(tls_config(&server, None)), After::KeepOpen).await;
    let upstream = upstream(&trusting(&pki));
    let url = base(&engine, "https");
    assert_eq!(
        post(&upstream, &url).await.unwrap(),
        (StatusCode::OK, Bytes::from("/v1/completions over TLS"))
    );
    assert!(upstream.probe(&url, GUARD).await, "/health over TLS");
    let (status, body) = upstream.get(&url, "/metrics", GUARD).await.unwrap();
    assert_eq!(
        (status, &body[..]),
        (StatusCode::OK, &b"/metrics over TLS"[..])
    );
    assert!(
        upstream.server_info(&url).await.is_some(),
        "/server_info over TLS"
    );
    assert_eq!(
        engine.connections.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one handshake: the connection is pooled and reused"
    );
}

#[tokio::test]
async fn an_engine_certificate_no_trusted_authority_signed_is_refused() {
    let pki = Pki::new("untrusted");
    let server = pki.issue("engine", &["127.0.0.1"]);
    let engine = engine(Some(tls_config(&server, None)), After::KeepOpen).await;
    let other = Pki::new("untrusted-other");
    for files in [TlsFiles::default(), trusting(&other)] {
        let error = post(&upstream(&files), &base(&engine, "https"))
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "TLS handshake failed: invalid peer certificate: UnknownIssuer"
        );
        assert!(error.never_sent(), "another engine may take the request");
        assert_eq!(error.describe(), "TLS handshake failed");
    }
}

#[tokio::test]
async fn an_engine_certificate_must_name_the_url_host() {
    let pki = Pki::new("name");
    let server = pki.issue("engine", &["engine-1.example"]);
    let engine = engine(Some(tls_config(&server, None)), After::KeepOpen).await;
    let error = post(&upstream(&trusting(&pki)), &base(&engine, "https"))
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("TLS handshake failed: invalid peer certificate: certificate not valid for name \"127.0.0.1\""),
        "{error}"
    );
}

#[tokio::test]
async fn an_engine_requiring_a_client_certificate_takes_the_configured_one() {
    let pki = Pki::new("mtls");
    let server = pki.issue("engine", &["127.0.0.1"]);
    let engine = engine(
        Some(tls_config(&server, Some(pki.roots()))),
        After::KeepOpen,
    )
    .await;
    let url = base(&engine, "https");
    let refused = post(&upstream(&trusting(&pki)), &url).await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        "TLS handshake failed: received fatal alert: CertificateRequired"
    );
    assert!(refused.never_sent(), "the engine never read the request");
    let router = pki.issue("router", &["router.example"]);
    let files = TlsFiles {
        cert_file: Some(router.cert_file),
        key_file: Some(router.key_file),
        ..trusting(&pki)
    };
    assert_eq!(
        post(&upstream(&files), &url).await.unwrap(),
        (StatusCode::OK, Bytes::from("/v1/completions over TLS"))
    );
}

#[tokio::test]
async fn a_client_certificate_from_another_authority_is_refused() {
    let pki = Pki::new("mtls-other");
    let server = pki.issue("engine", &["127.0.0.1"]);
    let engine = engine(
        Some(tls_config(&server, Some(pki.roots()))),
        After::KeepOpen,
    )
    .await;
    let strangers = Pki::new("mtls-stranger");
    let stranger = strangers.issue("router", &["router.example"]);
    let files = TlsFiles {
        cert_file: Some(stranger.cert_file.clone()),
        key_file: Some(stranger.key_file.clone()),
        ..trusting(&pki)
    };
    let refused = post(&upstream(&files), &base(&engine, "https"))
        .await
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "TLS handshake failed: received fatal alert: UnknownCA"
    );
}

#[tokio::test]
async fn http_engines_are_reached_as_before_by_a_client_with_tls() {
    let engine = engine(None, After::KeepOpen).await;
    let pki = Pki::new("plain");
    let url = base(&engine, "http");
    for upstream in [Upstream::new(timeouts()), upstream(&trusting(&pki))] {
        assert_eq!(
            post(&upstream, &url).await.unwrap(),
            (StatusCode::OK, Bytes::from("/v1/completions over TCP"))
        );
        assert!(upstream.probe(&url, GUARD).await);
    }
}

#[tokio::test]
async fn a_client_without_tls_settings_says_so() {
    let pki = Pki::new("unset");
    let server = pki.issue("engine", &["127.0.0.1"]);
    let engine = engine(Some(tls_config(&server, None)), After::KeepOpen).await;
    let error = post(&Upstream::new(timeouts()), &base(&engine, "https"))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "TLS handshake failed: this client has no TLS settings for https:// engines"
    );
}

#[tokio::test]
async fn a_pooled_tls_connection_the_engine_closed_is_not_reused() {
    let pki = Pki::new("closed");
    let server = pki.issue("engine", &["127.0.0.1"]);
    let mut engine = engine(Some(tls_config(&server, None)), After::Close).await;
    let upstream = upstream(&trusting(&pki));
    let url = base(&engine, "https");
    assert_eq!(post(&upstream, &url).await.unwrap().0, StatusCode::OK);
    engine
        .closed
        .recv()
        .await
        .expect("the engine closed the connection");
    // A written POST is never sent twice: it succeeds only on a new connection.
    assert_eq!(post(&upstream, &url).await.unwrap().0, StatusCode::OK);
    assert_eq!(
        engine.connections.load(std::sync::atomic::Ordering::SeqCst),
        2
    );
}

/// An engine that takes the connection but never answers the handshake: the
/// connect timeout ends the wait, as it does for a connection never made.
#[tokio::test(start_paused = true)]
async fn the_handshake_counts_against_the_connect_timeout() {
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", silent.local_addr().unwrap());
    let pki = Pki::new("silent");
    let error = post(&upstream(&trusting(&pki)), &url).await.unwrap_err();
    assert!(matches!(error, UpstreamError::ConnectTimeout), "{error}");
    assert!(error.never_sent());
    drop(silent);
}

#[test]
fn tls_files_problems_name_the_file_and_the_problem() {
    let pki = Pki::new("files");
    let router = pki.issue("router", &["router.example"]);
    let other = pki.issue("other", &["other.example"]);
    let missing = pki.file("gone.pem", "").with_extension("missing");
    let no_pem = pki.file("text.pem", "not a certificate\n");
    let too_large = pki.file("large.pem", vec![b'#'; (MAX_PEM_BYTES + 1) as usize]);
    let load = |files: TlsFiles| EngineTls::load(&files).unwrap_err();
    let problem = |files: TlsFiles| match load(files) {
        TlsError::File {
            file,
            path,
            problem,
        } => (file, path, problem),
        e => panic!("{e}"),
    };
    let (file, path, text) = problem(TlsFiles {
        ca_file: Some(missing.clone()),
        ..TlsFiles::default()
    });
    assert_eq!((file, path), (TlsFile::Ca, missing));
    assert!(text.starts_with("No such file"), "{text}");
    assert_eq!(
        problem(TlsFiles {
            ca_file: Some(no_pem.clone()),
            ..TlsFiles::default()
        }),
        (
            TlsFile::Ca,
            no_pem.clone(),
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into()
        )
    );
    assert_eq!(
        problem(TlsFiles {
            ca_file: Some(too_large.clone()),
            ..TlsFiles::default()
        }),
        (
            TlsFile::Ca,
            too_large,
            format!("larger than {MAX_PEM_BYTES} bytes")
        )
    );
    assert_eq!(
        problem(TlsFiles {
            cert_file: Some(router.cert_file.clone()),
            key_file: Some(no_pem.clone()),
            ..TlsFiles::default()
        }),
        (
            TlsFile::Key,
            no_pem,
            "holds no PEM private key (PKCS#8, PKCS#1 or SEC1)".into()
        )
    );
    let (file, path, text) = problem(TlsFiles {
        cert_file: Some(router.cert_file.clone()),
        key_file: Some(other.key_file.clone()),
        ..TlsFiles::default()
    });
    assert_eq!((file, path), (TlsFile::Key, other.key_file));
    assert!(
        text.starts_with(&format!("not the key of {}", router.cert_file.display())),
        "{text}"
    );
    assert_eq!(
        load(TlsFiles {
            cert_file: Some(router.cert_file),
            ..TlsFiles::default()
        }),
        TlsError::Unpaired
    );
    let error = load(TlsFiles {
        ca_file: Some(router.key_file.clone()),
        ..TlsFiles::default()
    });
    assert_eq!(
        error.to_string(),
        format!(
            "{}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            router.key_file.display()
        ),
        "the message names the file"
    );
}
