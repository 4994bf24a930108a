//! Throwaway TLS material for tests that run servers over TLS: a CA made at test time
//! (rcgen) and certificates it signs for `localhost` and `127.0.0.1`, written as PEM files
//! to a temporary directory that goes away with the [`Pki`].

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

/// A CA and the certificates it signed, as files.
pub struct Pki {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate (PEM).
    pub ca: PathBuf,
}

/// A certificate file and its key file (PEM).
#[derive(Debug, Clone)]
pub struct Leaf {
    /// Certificate.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
}

impl Pki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("a CA certificate");
        let ca = write(dir.path(), &format!("{name}-ca.pem"), &cert.pem());
        Self {
            dir,
            issuer: Issuer::new(params, key),
            ca,
        }
    }

    /// A certificate named `name`, valid for `localhost` and `127.0.0.1`, for servers and
    /// clients alike.
    pub fn leaf(&self, name: &str) -> Leaf {
        let key = KeyPair::generate().expect("a key");
        let sans = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let mut params = CertificateParams::new(sans).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).expect("a certificate");
        Leaf {
            cert: write(self.dir.path(), &format!("{name}.pem"), &cert.pem()),
            key: write(
                self.dir.path(),
                &format!("{name}-key.pem"),
                &key.serialize_pem(),
            ),
        }
    }

    /// A file `name` holding `text` in the PKI's directory.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        write(self.dir.path(), name, text)
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a PEM file");
    path
}
