//! NodePrepareResources and NodeUnprepareResources over the DRA API version
//! chosen at registration, and the CDI devices each container gets.

use dra_cpu_proto::kubelet::{dra_v1, dra_v1beta1};
use std::collections::BTreeMap;

use super::{
    Claim, DraVersion, KubeletDra, KubeletDraError, PrepareOutcome, PreparedDevice, CALL_TIMEOUT,
};

/// The CDI device ids kubelet gives a container from a prepared claim: those
/// of every device whose `request_names` list the container's request, or of
/// every device when the container names no request (`cdiDevicesAsList`).
/// Duplicates are kept, as kubelet keeps them.
pub fn cdi_ids_for_container(devices: &[PreparedDevice], request: &str) -> Vec<String> {
    devices
        .iter()
        .filter(|d| {
            request.is_empty()
                || d.request_names.is_empty()
                || d.request_names.iter().any(|r| r == request)
        })
        .flat_map(|d| d.cdi_device_ids.iter().cloned())
        .collect()
}

/// The request's claims as `$api` messages; the DRA API versions share
/// their message shapes and differ only in the generated module path.
macro_rules! claims_of {
    ($api:ident, $claims:expr) => {
        $claims
            .iter()
            .map(|c| $api::Claim {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                uid: c.uid.clone(),
            })
            .collect()
    };
}

/// NodePrepareResources over `$api`, answers keyed by claim UID.
macro_rules! prepare_over {
    ($api:ident, $channel:expr, $claims:expr, $call_error:expr) => {{
        let mut request = tonic::Request::new($api::NodePrepareResourcesRequest {
            claims: claims_of!($api, $claims),
        });
        request.set_timeout(CALL_TIMEOUT);
        let mut client = $api::dra_plugin_client::DraPluginClient::new($channel.clone());
        client
            .node_prepare_resources(request)
            .await
            .map_err($call_error)?
            .into_inner()
            .claims
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    .map(|d| PreparedDevice {
                        request_names: d.request_names,
                        pool_name: d.pool_name,
                        device_name: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                    })
                    .collect();
                (
                    uid,
                    PrepareOutcome {
                        devices,
                        error: r.error,
                    },
                )
            })
            .collect()
    }};
}

/// NodeUnprepareResources over `$api`: claim UID → error string.
macro_rules! unprepare_over {
    ($api:ident, $channel:expr, $claims:expr, $call_error:expr) => {{
        let mut request = tonic::Request::new($api::NodeUnprepareResourcesRequest {
            claims: claims_of!($api, $claims),
        });
        request.set_timeout(CALL_TIMEOUT);
        let mut client = $api::dra_plugin_client::DraPluginClient::new($channel.clone());
        client
            .node_unprepare_resources(request)
            .await
            .map_err($call_error)?
            .into_inner()
            .claims
            .into_iter()
            .map(|(uid, r)| (uid, r.error))
            .collect()
    }};
}

/// Kubelet's checks on an answer: no claim it did not ask for, none left
/// out (`pkg/kubelet/cm/dra/manager.go`).
fn check_answered<'a>(
    claims: &[Claim],
    answered: impl Iterator<Item = &'a String>,
) -> Result<(), KubeletDraError> {
    let mut answered: Vec<&String> = answered.collect();
    if let Some(unknown) = answered
        .iter()
        .find(|uid| !claims.iter().any(|c| &&c.uid == *uid))
    {
        return Err(KubeletDraError::UnknownClaim((*unknown).clone()));
    }
    answered.sort();
    for claim in claims {
        if answered.binary_search(&&claim.uid).is_err() {
            return Err(KubeletDraError::MissingClaim(claim.uid.clone()));
        }
    }
    Ok(())
}

impl KubeletDra {
    /// NodePrepareResources; every requested claim must be answered.
    pub async fn prepare(
        &self,
        claims: &[Claim],
    ) -> Result<BTreeMap<String, PrepareOutcome>, KubeletDraError> {
        let call_error = |status| KubeletDraError::Call {
            call: "NodePrepareResources",
            path: self.endpoint(),
            status,
        };
        let answers: BTreeMap<String, PrepareOutcome> = match self.version {
            DraVersion::V1 => prepare_over!(dra_v1, self.channel, claims, call_error),
            DraVersion::V1beta1 => prepare_over!(dra_v1beta1, self.channel, claims, call_error),
        };
        check_answered(claims, answers.keys())?;
        Ok(answers)
    }

    /// NodeUnprepareResources: claim UID → error string ("" on success).
    pub async fn unprepare(
        &self,
        claims: &[Claim],
    ) -> Result<BTreeMap<String, String>, KubeletDraError> {
        let call_error = |status| KubeletDraError::Call {
            call: "NodeUnprepareResources",
            path: self.endpoint(),
            status,
        };
        let answers: BTreeMap<String, String> = match self.version {
            DraVersion::V1 => unprepare_over!(dra_v1, self.channel, claims, call_error),
            DraVersion::V1beta1 => unprepare_over!(dra_v1beta1, self.channel, claims, call_error),
        };
        check_answered(claims, answers.keys())?;
        Ok(answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdi_ids_follow_the_containers_request() {
        let device = |requests: &[&str], ids: &[&str]| PreparedDevice {
            request_names: requests.iter().map(|s| s.to_string()).collect(),
            pool_name: "node".into(),
            device_name: "d".into(),
            cdi_device_ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        let devices = [
            device(&["cpus"], &["a"]),
            device(&["cpus"], &[]),
            device(&["helper"], &["a"]),
            device(&["cpus/big"], &["b"]),
        ];
        assert_eq!(cdi_ids_for_container(&devices, ""), ["a", "a", "b"]);
        assert_eq!(cdi_ids_for_container(&devices, "cpus"), ["a"]);
        assert_eq!(cdi_ids_for_container(&devices, "helper"), ["a"]);
        assert!(cdi_ids_for_container(&devices, "big").is_empty());
    }

    #[test]
    fn answers_must_cover_exactly_the_claims_asked_for() {
        let claim = |uid: &str| Claim {
            namespace: "ns".into(),
            name: uid.into(),
            uid: uid.into(),
        };
        let asked = [claim("a"), claim("b")];
        let uids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_answered(&asked, uids(&["b", "a"]).iter()).is_ok());
        assert!(matches!(
            check_answered(&asked, uids(&["a"]).iter()),
            Err(KubeletDraError::MissingClaim(uid)) if uid == "b"
        ));
        assert!(matches!(
            check_answered(&asked, uids(&["a", "b", "c"]).iter()),
            Err(KubeletDraError::UnknownClaim(uid)) if uid == "c"
        ));
    }
}
