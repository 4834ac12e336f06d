//! Whether the DaemonSet that runs this plugin is being removed (`helm
//! uninstall`): then, and only then, dra-plugin puts the node's tuning back
//! as it stops, since no kubelet call will ever unprepare the claims it
//! tuned. A restart, an upgrade or a drain keeps the DaemonSet, and so the
//! tuning of claims still prepared.
//!
//! The DaemonSet is watched from the start: at uninstall Helm deletes it
//! before the RBAC objects that let this plugin read it, and the pods get
//! their SIGTERM only after that, too late to ask.

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// `namespace/name` of a DaemonSet.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct DaemonSetRef {
    pub namespace: String,
    pub name: String,
}

/// A `--daemonset` value (flag or config file) that is not `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not namespace/name of a DaemonSet (a DNS label, a slash, a DNS subdomain)")]
pub struct NotADaemonSetRef(pub String);

impl std::str::FromStr for DaemonSetRef {
    type Err = NotADaemonSetRef;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once('/') {
            Some((namespace, name))
                if crate::k8s_names::is_dns_label(namespace)
                    && crate::k8s_names::is_dns_subdomain(name) =>
            {
                Ok(DaemonSetRef {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(NotADaemonSetRef(text.to_string())),
        }
    }
}

impl TryFrom<String> for DaemonSetRef {
    type Error = NotADaemonSetRef;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl std::fmt::Display for DaemonSetRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What one watch event says of the DaemonSet: `Some(true)` when it is
/// going (deleted, or marked for deletion), `Some(false)` when it is there,
/// `None` when the event says nothing of it.
pub fn going(event: &Event<DaemonSet>) -> Option<bool> {
    match event {
        Event::Apply(ds) | Event::InitApply(ds) => Some(ds.metadata.deletion_timestamp.is_some()),
        Event::Delete(_) => Some(true),
        Event::Init | Event::InitDone => None,
    }
}

/// Watches the DaemonSet until `stop`, setting `gone` once it has been seen
/// and then deleted. A DaemonSet never seen (the flag names another, or
/// RBAC does not allow the watch) sets nothing: a misconfiguration must not
/// untune the node at every restart.
pub async fn watch(
    client: kube::Client,
    owner: DaemonSetRef,
    gone: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let api: Api<DaemonSet> = Api::namespaced(client, &owner.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", owner.name));
    let events = watcher(api, config).default_backoff();
    tokio::pin!(events);
    let mut seen = false;
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            Some(Ok(event)) => {
                if matches!(event, Event::InitDone) && !seen {
                    tracing::warn!(daemonset = %owner, "the DaemonSet this plugin runs in is not found: tuning will not be put back at its removal");
                }
                match going(&event) {
                    Some(true) if seen && !gone.swap(true, Ordering::SeqCst) => {
                        tracing::info!(daemonset = %owner, "the DaemonSet is being removed: the node's tuning is put back when dra-plugin stops");
                    }
                    Some(true) => {}
                    Some(going) => seen = seen || !going,
                    None => {}
                }
            }
            Some(Err(err)) => {
                tracing::warn!(daemonset = %owner, "watching the DaemonSet: {}", crate::api_client::error_chain(&err))
            }
            None => {
                stop.cancelled().await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn daemonset(deleting: bool) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some("dra-cpu".into()),
                deletion_timestamp: deleting.then(|| Time(Default::default())),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn going_table() {
        let cases = [
            (Event::Apply(daemonset(false)), Some(false)),
            (Event::InitApply(daemonset(false)), Some(false)),
            (Event::Apply(daemonset(true)), Some(true)),
            (Event::Delete(daemonset(false)), Some(true)),
            (Event::Init, None),
            (Event::InitDone, None),
        ];
        for (event, want) in cases {
            assert_eq!(going(&event), want, "{event:?}");
        }
    }

    #[test]
    fn references_parse_or_say_why_not() {
        let ok: DaemonSetRef = "dra-cpu/dra-cpu".parse().expect("parses");
        assert_eq!(ok.to_string(), "dra-cpu/dra-cpu");
        for bad in ["dra-cpu", "/x", "x/", "Bad/x", "a/b/c"] {
            let error = bad.parse::<DaemonSetRef>().expect_err(bad).to_string();
            assert!(error.contains("not namespace/name"), "{error}");
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
    }
}
