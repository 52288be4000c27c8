//! Engine base URLs: what is accepted, and the host and `host:port` they name.

use std::sync::Arc;

use http::Uri;

/// Why a string is not an engine base URL. The message never repeats the URL, so it
/// can reach a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineUrlError {
    /// It does not parse as a URL.
    #[error("not a URL: {0}")]
    NotAUrl(String),
    /// Its scheme is not `http`.
    #[error("must start with http:// (engines are reached over plain HTTP)")]
    NotHttp,
    /// It names no host.
    #[error("needs a host")]
    NoHost,
    /// It has a path or a query.
    #[error("must be a base URL without a path or query")]
    NotABase,
}

/// Checks that `url` is an `http://host:port` engine base URL.
///
/// # Errors
/// What is wrong with it.
pub fn check_engine_url(url: &str) -> Result<(), EngineUrlError> {
    let uri: Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| EngineUrlError::NotAUrl(e.to_string()))?;
    if uri.scheme_str() != Some("http") {
        return Err(EngineUrlError::NotHttp);
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(EngineUrlError::NoHost);
    }
    if uri
        .path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
    {
        return Err(EngineUrlError::NotABase);
    }
    Ok(())
}

/// The host of an engine base URL (empty when it has none).
pub fn url_host(url: &str) -> String {
    url.parse::<Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_owned))
        .unwrap_or_default()
}

/// The `host:port` an engine base URL is reached at (port 80 when it names none).
pub fn authority(url: &str) -> Option<Arc<str>> {
    let uri: Uri = url.parse().ok()?;
    let host = uri.host().filter(|h| !h.is_empty())?;
    let port = uri.port_u16().unwrap_or(80);
    Some(Arc::from(format!("{host}:{port}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_urls_are_plain_http_base_urls() {
        assert!(check_engine_url("http://10.0.0.7:30000").is_ok());
        assert!(check_engine_url("http://engine-1:8000/").is_ok());
        assert_eq!(
            check_engine_url("https://e:1").unwrap_err().to_string(),
            "must start with http:// (engines are reached over plain HTTP)"
        );
        assert_eq!(
            check_engine_url("http://e:1/v1").unwrap_err().to_string(),
            "must be a base URL without a path or query"
        );
        assert!(
            check_engine_url("not a url")
                .unwrap_err()
                .to_string()
                .starts_with("not a URL")
        );
    }

    #[test]
    fn engines_are_reached_at_host_and_port() {
        let authority = |url| authority(url).as_deref().map(str::to_owned);
        assert_eq!(
            authority("http://10.0.0.7:30000").as_deref(),
            Some("10.0.0.7:30000")
        );
        assert_eq!(
            authority("http://engine-1/").as_deref(),
            Some("engine-1:80")
        );
        assert_eq!(
            authority("http://[::1]:8000").as_deref(),
            Some("[::1]:8000")
        );
        assert_eq!(authority("not a url"), None);
        assert_eq!(url_host("http://[::1]:8000"), "[::1]");
        assert_eq!(url_host("/only/a/path"), "");
    }
}
