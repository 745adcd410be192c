//! TLS for Hubble's API off loopback: the server's certificate and key,
//! and the CAs a client's certificate must chain to (every client must
//! show one, as between Hubble's agents and Relay). HTTP/2 is offered by
//! ALPN, as gRPC wants. The files are read again when they change (a
//! renewed certificate), for the connections that follow.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where the server's certificate, its key and the client CAs are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CAs a client's certificate must chain to (PEM, any number in
    /// each file).
    pub client_cas: Vec<PathBuf>,
}

/// Why TLS cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read or holds no usable PEM.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// The certificates and key do not make a configuration.
    #[error("{0}")]
    Config(String),
}

fn file_error(path: &std::path::Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

/// The server's configuration: TLS 1.2 and 1.3 with ring, client
/// certificates required, ALPN `h2`.
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| file_error(&files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(&files.cert, e))?;
    if certs.is_empty() {
        return Err(file_error(&files.cert, "no certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| file_error(&files.key, e))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in &files.client_cas {
        let mut added = 0;
        for c in CertificateDer::pem_file_iter(ca).map_err(|e| file_error(ca, e))? {
            let c = c.map_err(|e| file_error(ca, e))?;
            roots.add(c).map_err(|e| file_error(ca, e))?;
            added += 1;
        }
        if added == 0 {
            return Err(file_error(ca, "no CA certificate in it"));
        }
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| TlsError::Config(format!("the client CAs: {e}")))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(format!("the certificate and key: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// How often the files are looked at, at most (when a client connects).
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// What tells a file's versions apart: where it is, when it was written
/// and its size (a Secret volume swaps a new file in).
type Stamp = Option<(u64, SystemTime, u64)>;

fn stamps(files: &TlsFiles) -> Vec<Stamp> {
    use std::os::unix::fs::MetadataExt;
    std::iter::once(&files.cert)
        .chain(std::iter::once(&files.key))
        .chain(&files.client_cas)
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.ino(), m.modified().ok()?, m.len()))
        })
        .collect()
}

struct Loaded {
    config: Arc<rustls::ServerConfig>,
    stamps: Vec<Stamp>,
    checked: Instant,
}

/// The server's configuration, read again when its files change: a new
/// certificate (cert-manager's renewal, a Secret updated) serves from the
/// next connection on, without a restart. Files that do not make a
/// configuration leave the last one serving, with a warning.
pub struct Reloading {
    files: TlsFiles,
    loaded: Mutex<Loaded>,
}

impl Reloading {
    /// The configuration of `files`, which must make one now.
    pub fn new(files: TlsFiles) -> Result<Reloading, TlsError> {
        let stamps = stamps(&files);
        let config = server_config(&files)?;
        Ok(Reloading {
            files,
            loaded: Mutex::new(Loaded {
                config,
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The configuration for a new connection: read again first if a file
    /// changed (looked at once a second at most).
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        let mut l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if l.checked.elapsed() >= CHECK_EVERY {
            l.checked = Instant::now();
            let now = stamps(&self.files);
            if now != l.stamps {
                // Tried once per change: a half-written pair is tried
                // again when its other half lands.
                l.stamps = now;
                match server_config(&self.files) {
                    Ok(c) => {
                        tracing::info!(cert = %self.files.cert.display(), "Hubble's TLS files changed: serving the new ones");
                        l.config = c;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "Hubble's TLS files changed but cannot serve: the previous ones still do");
                    }
                }
            }
        }
        l.config.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_cannot_serve_say_which_and_why() {
        let dir = std::env::temp_dir().join(format!("verdict-hubble-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let missing = TlsFiles {
            cert: dir.join("nope.crt"),
            key: dir.join("nope.key"),
            client_cas: vec![empty.clone()],
        };
        let e = server_config(&missing).unwrap_err().to_string();
        assert!(
            e.starts_with(&dir.join("nope.crt").display().to_string()),
            "{e}"
        );
        let no_cert = TlsFiles {
            cert: empty.clone(),
            ..missing
        };
        let e = server_config(&no_cert).unwrap_err().to_string();
        assert!(e.contains("no certificate in it"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
