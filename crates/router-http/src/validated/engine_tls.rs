//! The `engine_tls` section read: its files loaded into the client's TLS settings,
//! each problem named by the file's field.

use router_config::{ConfigError, EngineTlsConfig};
use router_upstream::{EngineTls, TlsError, TlsFile, TlsFiles};

/// How `https://` engines are reached as `config` says (the system's authorities
/// alone without it); `None`, with the problems in `errors`, when its files cannot
/// be used.
pub(super) fn load(
    config: Option<&EngineTlsConfig>,
    errors: &mut Vec<ConfigError>,
) -> Option<EngineTls> {
    let files = config.map_or_else(TlsFiles::default, |config| TlsFiles {
        ca_file: config.ca_file.clone(),
        cert_file: config.cert_file.clone(),
        key_file: config.key_file.clone(),
    });
    match EngineTls::load(&files) {
        Ok(tls) => Some(tls),
        // The field checks report a certificate without its key.
        Err(TlsError::Unpaired) => None,
        Err(error) => {
            errors.push(ConfigError::at(field(&error), error));
            None
        }
    }
}

/// The path of the field a problem is about.
fn field(error: &TlsError) -> &'static str {
    match error {
        TlsError::File {
            file: TlsFile::Ca, ..
        } => "engine_tls.ca_file",
        TlsError::File {
            file: TlsFile::Cert,
            ..
        } => "engine_tls.cert_file",
        TlsError::File {
            file: TlsFile::Key, ..
        } => "engine_tls.key_file",
        _ => "engine_tls",
    }
}
