//! The CAs a TLS client trusts, from PEM text: one reading for http tools (a Secret's or
//! ConfigMap's `ca.crt`) and for fetched OpenAPI documents (a file, Secret or ConfigMap).

use std::fmt::Display;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The certificates of `pem`, which `what` names in errors (a reference or a file, never
/// the text): every block must parse and be accepted, and there must be one at least.
///
/// # Errors
/// Text that is not PEM, a certificate rustls refuses, or no certificate at all.
pub(crate) fn roots_from_pem(pem: &str, what: &dyn Display) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|_| format!("{what} is not PEM"))?;
        roots
            .add(cert)
            .map_err(|e| format!("{what} holds a certificate rustls refuses: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{what} holds no PEM certificate"));
    }
    Ok(roots)
}

/// The public roots (webpki), trusted when no CA is named.
pub(crate) fn public_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    roots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_is_not_a_certificate_is_named_never_shown() {
        let cases = [
            ("", "holds no PEM certificate"),
            ("hello", "holds no PEM certificate"),
            (
                "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
                "is not PEM",
            ),
            (
                "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n",
                "certificate rustls refuses",
            ),
        ];
        for (pem, want) in cases {
            let e = roots_from_pem(pem, &"the CA file `/x`").unwrap_err();
            assert!(
                e.starts_with("the CA file `/x` ") && e.contains(want),
                "{pem:?}: {e}"
            );
        }
        assert!(!public_roots().is_empty());
    }
}
