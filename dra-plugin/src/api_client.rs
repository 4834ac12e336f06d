//! The API server client: from `--kubeconfig` or the in-cluster
//! configuration, with TLS trust taken from where the configuration says.
//!
//! kube 5 builds a rustls configuration for every client, also for a plain
//! `http://` server, and when the configuration carries no CA of its own it
//! asks the platform verifier for the system trust store
//! (`rustls-native-certs`: `SSL_CERT_FILE` / `SSL_CERT_DIR` when set, else
//! the distribution's bundle), which fails on a host without CA
//! certificates. Only an `https://` server verified without a CA of the
//! configuration's own needs that store; every other client is given an
//! empty CA list so that the system store is never read for it.

use anyhow::Context;
use std::path::Path;

/// Where a client's trust in the API server's certificate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerTrust {
    /// `http://`: no TLS, no certificate.
    PlainHttp,
    /// The configuration's own CA: the kubeconfig's `certificate-authority`
    /// (`-data`), or the service account's `ca.crt` in a pod.
    ConfigCa,
    /// `insecure-skip-tls-verify`: no certificate is checked.
    Unverified,
    /// `https://` and no CA of its own: the system trust store.
    SystemStore,
}

/// What `config` trusts. A proxy reached over TLS would need trust of its
/// own, so a plain `http://` server behind one counts as `https://`.
pub fn server_trust(config: &kube::Config) -> ServerTrust {
    let tls_proxy = config
        .proxy_url
        .as_ref()
        .is_some_and(|url| url.scheme_str() == Some("https"));
    if config.cluster_url.scheme_str() == Some("http") && !tls_proxy {
        return ServerTrust::PlainHttp;
    }
    if config.root_cert.is_some() {
        return ServerTrust::ConfigCa;
    }
    if config.accept_invalid_certs {
        return ServerTrust::Unverified;
    }
    ServerTrust::SystemStore
}

/// Builds the client for `config`, reading the system trust store only
/// when [`server_trust`] says it is needed.
pub fn client_from_config(mut config: kube::Config) -> anyhow::Result<kube::Client> {
    let trust = server_trust(&config);
    if matches!(trust, ServerTrust::PlainHttp | ServerTrust::Unverified) {
        // No certificate will be checked against any CA: an empty list keeps
        // kube from loading the system store it does not need.
        config.root_cert.get_or_insert_with(Vec::new);
    }
    let url = config.cluster_url.to_string();
    kube::Client::try_from(config).map_err(|e| {
        let built = anyhow::Error::new(e).context(format!("building the API client for {url}"));
        if trust == ServerTrust::SystemStore {
            built.context(format!(
                "the configuration names no certificate-authority for {url}, so its certificate is checked against the system trust store (SSL_CERT_FILE / SSL_CERT_DIR when set, else the CA certificates installed on this host), which could not be loaded: set certificate-authority or certificate-authority-data in the kubeconfig, or install CA certificates"
            ))
        } else {
            built
        }
    })
}

/// Builds a kube client from `--kubeconfig`, or the in-cluster configuration.
pub async fn kube_client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::incluster()
            .context("loading the in-cluster configuration (pass --kubeconfig outside a pod)")?,
    };
    client_from_config(config)
}

/// An error and all its sources on one line (a source whose message the
/// line already ends with is not repeated): kube's and hyper's errors keep
/// the cause, e.g. an unknown certificate issuer, in a source their own
/// message leaves out.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !said.is_empty() && !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> kube::Config {
        kube::Config::new(url.parse().expect("url"))
    }

    #[test]
    fn only_https_without_a_ca_of_its_own_needs_the_system_store() {
        let with = |url: &str, f: &dyn Fn(&mut kube::Config)| {
            let mut c = config(url);
            f(&mut c);
            c
        };
        let ca = |c: &mut kube::Config| c.root_cert = Some(vec![vec![1, 2, 3]]);
        let skip = |c: &mut kube::Config| c.accept_invalid_certs = true;
        let none = |_: &mut kube::Config| {};
        let tls_proxy =
            |c: &mut kube::Config| c.proxy_url = Some("https://proxy:3128".parse().expect("url"));
        let plain_proxy =
            |c: &mut kube::Config| c.proxy_url = Some("http://proxy:3128".parse().expect("url"));
        let table: [(kube::Config, ServerTrust); 8] = [
            (with("http://127.0.0.1:8080", &none), ServerTrust::PlainHttp),
            (with("http://127.0.0.1:8080", &ca), ServerTrust::PlainHttp),
            (
                with("http://127.0.0.1:8080", &plain_proxy),
                ServerTrust::PlainHttp,
            ),
            (
                with("http://127.0.0.1:8080", &tls_proxy),
                ServerTrust::SystemStore,
            ),
            (with("https://10.0.0.1", &ca), ServerTrust::ConfigCa),
            (with("https://10.0.0.1", &skip), ServerTrust::Unverified),
            (with("https://10.0.0.1", &none), ServerTrust::SystemStore),
            (with("https://api.example", &none), ServerTrust::SystemStore),
        ];
        for (c, want) in table {
            assert_eq!(
                server_trust(&c),
                want,
                "{} {:?}",
                c.cluster_url,
                c.proxy_url
            );
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{message}")]
    struct Layer {
        message: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn layers(messages: &[&'static str]) -> Layer {
        let mut error: Option<Box<Layer>> = None;
        for message in messages.iter().rev() {
            error = Some(Box::new(Layer {
                message,
                source: error,
            }));
        }
        *error.expect("at least one layer")
    }

    #[test]
    fn error_chains_say_every_cause_once() {
        let table: [(&[&'static str], &str); 3] = [
            (
                &[
                    "client error (Connect)",
                    "invalid peer certificate: UnknownIssuer",
                ],
                "client error (Connect): invalid peer certificate: UnknownIssuer",
            ),
            // A layer that already quotes its source is not repeated.
            (
                &["reading node n: HyperError: x", "x", "y"],
                "reading node n: HyperError: x: y",
            ),
            (&["alone"], "alone"),
        ];
        for (messages, want) in table {
            assert_eq!(error_chain(&layers(messages)), want);
        }
    }
}
