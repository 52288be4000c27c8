//! Engine base URLs: what is accepted, the host they name, and the [`Origin`] a
//! request goes to.

use std::fmt;
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
    /// Its scheme is neither `http` nor, in a build with TLS, `https`.
    #[cfg(feature = "tls")]
    #[error("must start with http:// or https://")]
    NotHttp,
    /// Its scheme is not `http` (this build has no TLS).
    #[cfg(not(feature = "tls"))]
    #[error("must start with http:// (this build has no TLS for https://)")]
    NotHttp,
    /// It names no host.
    #[error("needs a host")]
    NoHost,
    /// It has a path or a query.
    #[error("must be a base URL without a path or query")]
    NotABase,
}

/// Checks that `url` is an `http://host:port` engine base URL, or, in a build with
/// the `tls` feature, an `https://host:port` one.
///
/// # Errors
/// What is wrong with it.
pub fn check_engine_url(url: &str) -> Result<(), EngineUrlError> {
    let uri: Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| EngineUrlError::NotAUrl(e.to_string()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") if cfg!(feature = "tls") => {}
        _ => return Err(EngineUrlError::NotHttp),
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

/// Where requests to an engine go: its `host:port`, and whether over TLS. Pooled
/// connections are kept per origin. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    authority: Arc<str>,
    tls: bool,
}

impl Origin {
    /// The origin of an engine base URL: over TLS for `https://` (port 443 when it
    /// names none), plain for `http://` (port 80). `None` for another scheme or no
    /// host.
    pub fn of(url: &str) -> Option<Self> {
        let uri: Uri = url.parse().ok()?;
        let tls = match uri.scheme_str()? {
            "http" => false,
            "https" => true,
            _ => return None,
        };
        let host = uri.host().filter(|h| !h.is_empty())?;
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Some(Self {
            authority: Arc::from(format!("{host}:{port}")),
            tls,
        })
    }

    /// The `host:port` connected to (and sent as the `host` field).
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Whether requests go over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The host, as a TLS server name: an IPv6 address without its brackets.
    #[cfg(feature = "tls")]
    pub(crate) fn host(&self) -> &str {
        let host = self
            .authority
            .rsplit_once(':')
            .map_or(&*self.authority, |(host, _)| host);
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}", self.authority)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_urls_are_base_urls() {
        assert!(check_engine_url("http://10.0.0.7:30000").is_ok());
        assert!(check_engine_url("http://engine-1:8000/").is_ok());
        assert_eq!(
            check_engine_url("ftp://e:1").unwrap_err(),
            EngineUrlError::NotHttp
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

    #[cfg(feature = "tls")]
    #[test]
    fn https_engine_urls_are_accepted_with_tls() {
        assert!(check_engine_url("https://engine-1.example:8443").is_ok());
        assert!(check_engine_url("https://[::1]").is_ok());
        assert_eq!(
            check_engine_url("ftp://e:1").unwrap_err().to_string(),
            "must start with http:// or https://"
        );
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn https_engine_urls_need_tls() {
        assert_eq!(
            check_engine_url("https://e:1").unwrap_err().to_string(),
            "must start with http:// (this build has no TLS for https://)"
        );
    }

    #[test]
    fn engines_are_reached_at_their_origin() {
        let origin = |url| Origin::of(url).map(|o| o.to_string());
        assert_eq!(
            origin("http://10.0.0.7:30000").as_deref(),
            Some("http://10.0.0.7:30000")
        );
        assert_eq!(
            origin("http://engine-1/").as_deref(),
            Some("http://engine-1:80")
        );
        assert_eq!(
            origin("https://engine-1/").as_deref(),
            Some("https://engine-1:443")
        );
        assert_eq!(
            origin("http://[::1]:8000").as_deref(),
            Some("http://[::1]:8000")
        );
        assert_eq!(origin("not a url"), None);
        assert_eq!(origin("ftp://e:1"), None);
        let secure = Origin::of("https://e:8443").unwrap();
        assert_eq!((secure.authority(), secure.is_tls()), ("e:8443", true));
        assert_ne!(
            secure,
            Origin::of("http://e:8443").unwrap(),
            "one pool each"
        );
        assert_eq!(url_host("http://[::1]:8000"), "[::1]");
        assert_eq!(url_host("/only/a/path"), "");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn the_server_name_is_the_bare_host() {
        let host = |url| Origin::of(url).unwrap().host().to_owned();
        assert_eq!(host("https://engine-1.example:8443"), "engine-1.example");
        assert_eq!(host("https://10.0.0.7"), "10.0.0.7");
        assert_eq!(host("https://[::1]:8443"), "::1");
    }
}
