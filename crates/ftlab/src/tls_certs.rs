//! `ftlab tls-certs DIR`: a certificate authority, a server certificate and client
//! certificates, laid out as qemu's `tls-creds-x509` and libnbd's `tls-certificates=` read
//! them, for trying `serve --tls` (production deployments bring their own PKI).

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::path::Path;

#[derive(clap::Args)]
pub struct TlsCertsArgs {
    /// Where to write: ca-cert.pem, ca-key.pem, server-cert.pem, server-key.pem, and a folder
    /// client-NAME per --client holding ca-cert.pem, client-cert.pem, client-key.pem (what
    /// qemu's `tls-creds-x509,dir=` and libnbd's `tls-certificates=` expect). Created when
    /// absent; existing files are not replaced.
    dir: std::path::PathBuf,
    /// A client certificate with this subject CN (its principal for --policy: cn:NAME);
    /// repeat for several.
    #[arg(long = "client", value_name = "NAME")]
    clients: Vec<String>,
    /// Names the server certificate is valid for (DNS names or IP addresses); what clients
    /// check against the host they connect to.
    #[arg(long = "server-name", value_name = "NAME", default_values = ["localhost", "127.0.0.1", "::1"])]
    server_names: Vec<String>,
    /// Days the certificates stay valid from now.
    #[arg(long, default_value_t = 365)]
    days: u32,
}

pub fn run(args: TlsCertsArgs) -> Result<()> {
    write(&args.dir, &args.clients, &args.server_names, args.days)?;
    println!(
        "wrote a CA, a server certificate for {} and {} client certificate(s) to {}\n\
         serve with: ftlab serve --tls-cert {d}/server-cert.pem --tls-key {d}/server-key.pem --tls-ca {d}/ca-cert.pem",
        args.server_names.join(", "),
        args.clients.len(),
        args.dir.display(),
        d = args.dir.display()
    );
    Ok(())
}

/// The files `run` describes, in `dir`.
pub fn write(dir: &Path, clients: &[String], server_names: &[String], days: u32) -> Result<()> {
    anyhow::ensure!(days >= 1, "--days: at least 1");
    anyhow::ensure!(!server_names.is_empty(), "--server-name: at least one");
    for name in clients {
        anyhow::ensure!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c)),
            "--client `{name}`: letters, digits and - _ . @ only (it names a folder)"
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let now = time_now();
    let until = now + time_days(days);
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    // A name of its own, so that a certificate of another run's CA is told apart by name.
    ca.distinguished_name.push(
        DnType::CommonName,
        format!(
            "ftlab test CA {}",
            hex(&ca_key.public_key_raw()[ca_key.public_key_raw().len() - 6..])
        ),
    );
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (ca.not_before, ca.not_after) = (now, until);
    let ca_cert = ca.self_signed(&ca_key)?;
    write_new(&dir.join("ca-cert.pem"), &ca_cert.pem(), false)?;
    write_new(&dir.join("ca-key.pem"), &ca_key.serialize_pem(), true)?;

    let leaf = |cn: &str, sans: Vec<String>, purpose: ExtendedKeyUsagePurpose| -> Result<_> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(sans)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![purpose];
        // GnuTLS (qemu, libnbd) checks these on its own certificate.
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        (p.not_before, p.not_after) = (now, until);
        let cert = p.signed_by(&key, &ca_cert, &ca_key)?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    let (cert, key) = leaf(
        &server_names[0],
        server_names.to_vec(),
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    write_new(&dir.join("server-cert.pem"), &cert, false)?;
    write_new(&dir.join("server-key.pem"), &key, true)?;
    for name in clients {
        let dir = dir.join(format!("client-{name}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let (cert, key) = leaf(name, Vec::new(), ExtendedKeyUsagePurpose::ClientAuth)?;
        write_new(&dir.join("ca-cert.pem"), &ca_cert.pem(), false)?;
        write_new(&dir.join("client-cert.pem"), &cert, false)?;
        write_new(&dir.join("client-key.pem"), &key, true)?;
    }
    Ok(())
}

/// Writes a file that must not exist yet (a key is readable by its owner only).
fn write_new(path: &Path, text: &str, secret: bool) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| {
            format!(
                "creating {} (it is not replaced if it exists)",
                path.display()
            )
        })?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Now, to the second, a minute back (for clocks a little apart).
fn time_now() -> time::OffsetDateTime {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    time::OffsetDateTime::from_unix_timestamp(secs - 60).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn time_days(days: u32) -> time::Duration {
    time::Duration::days(days as i64)
}
