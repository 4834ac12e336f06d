//! What the API server accepts, learnt before the first publish and from
//! its refusals: the fields its OpenAPI v3 document declares, its release
//! from `/version`, and the refusals that name the node-allocatable mapping
//! or the PCIe root list, or drop shared devices (see the publisher's doc).

use super::{PublishError, Publisher};
use crate::slices::ATTR_PCIE_ROOT;
use crate::slices::{build_slices, NodeOwner};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{Patch, PatchParams};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The OpenAPI v3 document that declares the ResourceSlice fields.
pub const OPENAPI_RESOURCE_V1: &str = "/openapi/v3/apis/resource.k8s.io/v1";
pub(super) const DEVICE_SCHEMA: &str = "io.k8s.api.resource.v1.Device";
pub(super) const ATTRIBUTE_SCHEMA: &str = "io.k8s.api.resource.v1.DeviceAttribute";
/// The list value a pcieRoot attribute is published in.
pub(super) const LIST_FIELD: &str = "strings";
/// The first release whose DeviceAttribute declares [`LIST_FIELD`].
pub(super) const LIST_MINOR: u32 = 36;
/// The KEP-5517 mapping field in its 1.37 shape.
pub const MAPPING_FIELD: &str = "nodeAllocatableResources";
/// The first release whose Device declares [`MAPPING_FIELD`] (kubernetes
/// #140009 renamed 1.36's `nodeAllocatableResourceMappings`).
pub(super) const MAPPING_MINOR: u32 = 37;

/// Whether `error` is the server refusing an apply because its schema does
/// not declare the mapping field (structured-merge-diff's
/// `.spec.devices[N].nodeAllocatableResources: field not declared in schema`).
pub fn is_undeclared_mapping(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => {
            status.code == 500
                && status
                    .message
                    .contains(&format!(".{MAPPING_FIELD}: field not declared in schema"))
        }
        _ => false,
    }
}

/// The field names of `io.k8s.api.resource.v1.Device` in an OpenAPI v3
/// document, or `None` if the document does not describe it.
pub fn declared_device_fields(openapi: &Value) -> Option<BTreeSet<String>> {
    declared_fields(openapi, DEVICE_SCHEMA)
}

/// The field names of `io.k8s.api.resource.v1.DeviceAttribute`.
pub fn declared_attribute_fields(openapi: &Value) -> Option<BTreeSet<String>> {
    declared_fields(openapi, ATTRIBUTE_SCHEMA)
}

pub(super) fn declared_fields(openapi: &Value, schema: &str) -> Option<BTreeSet<String>> {
    let properties = openapi
        .pointer(&format!("/components/schemas/{schema}/properties"))?
        .as_object()?;
    Some(properties.keys().cloned().collect())
}

/// Whether `error` is the server refusing the pcieRoot attribute: a
/// validation error naming it (422; a 1.36/1.37 server without the
/// `DRAListTypeAttributes` gate drops the list and then finds the attribute
/// without a value), or a schema without list values (500, `.strings: field
/// not declared in schema`).
pub fn is_refused_pcie_roots(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => {
            (status.code == 422 && status.message.contains(ATTR_PCIE_ROOT))
                || (status.code == 500
                    && status
                        .message
                        .contains(&format!(".{LIST_FIELD}: field not declared in schema")))
        }
        _ => false,
    }
}

/// The minor release of a `/version` answer (`"37"`, `"37+"` on some
/// distributions), if readable.
pub fn minor_release(info: &k8s_openapi::apimachinery::pkg::version::Info) -> Option<u32> {
    if info.major.trim_end_matches('+') != "1" {
        return None;
    }
    let digits: String = info
        .minor
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Whether the server keeps `allowMultipleAllocations` on the devices of
/// `sent`, judged from what it answered (`returned`).
pub fn keeps_multiple_allocations(sent: &ResourceSlice, returned: &ResourceSlice) -> bool {
    let returned: BTreeMap<&str, &Device> = returned
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| (d.name.as_str(), d))
        .collect();
    sent.spec
        .devices
        .iter()
        .flatten()
        .filter(|d| d.allow_multiple_allocations == Some(true))
        .all(|d| {
            returned
                .get(d.name.as_str())
                .is_some_and(|r| r.allow_multiple_allocations == Some(true))
        })
}

/// The devices without the KEP-5517 mapping.
pub fn without_mapping(devices: &[Device]) -> Vec<Device> {
    devices
        .iter()
        .cloned()
        .map(|mut d| {
            d.node_allocatable_resources = None;
            d
        })
        .collect()
}

pub(super) fn shares_devices(devices: &[Device]) -> bool {
    devices
        .iter()
        .any(|d| d.allow_multiple_allocations == Some(true))
}

/// The probes, run by the publisher before its first publish.
impl Publisher {
    /// Whether this server's DeviceAttribute declares list values: from the
    /// OpenAPI v3 document, else from `/version`.
    pub(super) async fn learn_list_attribute_support(&self) -> Result<bool, PublishError> {
        self.learn_field_support(ATTRIBUTE_SCHEMA, LIST_FIELD, LIST_MINOR, "list attributes")
            .await
    }

    /// Whether this server's Device declares the mapping field: from the
    /// OpenAPI v3 document, else from `/version`.
    pub(super) async fn learn_mapping_support(&self) -> Result<bool, PublishError> {
        self.learn_field_support(DEVICE_SCHEMA, MAPPING_FIELD, MAPPING_MINOR, "the mapping")
            .await
    }

    /// Whether `schema` of this server declares `field`: from the OpenAPI v3
    /// document (exactly what the server takes), else from `/version`
    /// (`field` came with release 1.`minor`).
    async fn learn_field_support(
        &self,
        schema: &str,
        field: &str,
        minor: u32,
        what: &str,
    ) -> Result<bool, PublishError> {
        let openapi = match http::Request::get(OPENAPI_RESOURCE_V1).body(Vec::new()) {
            Ok(request) => match self.client.request::<Value>(request).await {
                Ok(document) => match declared_fields(&document, schema) {
                    Some(fields) => return Ok(fields.contains(field)),
                    None => format!("no {schema} schema in the document"),
                },
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        let info =
            self.client
                .apiserver_version()
                .await
                .map_err(|source| PublishError::Discover {
                    openapi: openapi.clone(),
                    source,
                })?;
        tracing::info!(node = %self.node, "the OpenAPI document was not readable ({openapi}); judging {what} by /version {}.{}", info.major, info.minor);
        Ok(minor_release(&info).is_some_and(|release| release >= minor))
    }

    /// Whether the server keeps `allowMultipleAllocations`: a dry-run apply
    /// of the first slice with a shareable device, compared with the answer.
    pub(super) async fn probe_consumable_capacity(
        &self,
        owner: &NodeOwner,
        devices: &[Device],
    ) -> Result<bool, PublishError> {
        let slices = build_slices(&self.driver, &self.node, Some(owner), devices.to_vec(), 1)
            .map_err(|source| PublishError::Build {
                node: self.node.clone(),
                source,
            })?;
        let Some(sent) = slices
            .into_iter()
            .find(|s| shares_devices(s.spec.devices.as_deref().unwrap_or_default()))
        else {
            return Ok(true);
        };
        let name = sent.metadata.name.clone().unwrap_or_default();
        let params = PatchParams::apply(&self.driver).force().dry_run();
        let returned = self
            .slices
            .patch(&name, &params, &Patch::Apply(&sent))
            .await
            .map_err(|source| PublishError::Probe {
                slice: name.clone(),
                source,
            })?;
        Ok(keeps_multiple_allocations(&sent, &returned))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::DeviceMode;
    use crate::publisher::tests::devices;
    use crate::slices::build_slices;
    use serde_json::json;

    #[test]
    fn openapi_and_version_answers_are_read() {
        let doc = json!({"components": {"schemas": {DEVICE_SCHEMA: {"properties":
            {"name": {}, "nodeAllocatableResources": {}}}}}});
        let fields = declared_device_fields(&doc).unwrap();
        assert!(fields.contains(MAPPING_FIELD) && fields.contains("name"));
        assert_eq!(declared_device_fields(&json!({"components": {}})), None);
        let info = |major: &str, minor: &str| k8s_openapi::apimachinery::pkg::version::Info {
            major: major.to_string(),
            minor: minor.to_string(),
            ..Default::default()
        };
        for (major, minor, want) in [
            ("1", "37", Some(37)),
            ("1", "36+", Some(36)),
            ("1", "", None),
            ("2", "1", None),
        ] {
            assert_eq!(minor_release(&info(major, minor)), want, "{major}.{minor}");
        }
    }

    #[test]
    fn refusals_of_the_pcie_root_list_are_recognised() {
        let status = |code: u16, message: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: message.to_string(),
                ..Default::default()
            }))
        };
        let cases = [
            // 1.36/1.37 without DRAListTypeAttributes: the list dropped,
            // the attribute left without a value.
            (422, r#"ResourceSlice.resource.k8s.io "n-dra.cpu-0" is invalid: spec.devices[0].attributes[resource.kubernetes.io/pcieRoot]: Invalid value: "": exactly one value must be specified"#, true),
            // A schema without list values.
            (500, "failed to create typed patch object (/n-dra.cpu-0; resource.k8s.io/v1, Kind=ResourceSlice): .spec.devices[0].attributes.resource.kubernetes.io/pcieRoot.strings: field not declared in schema", true),
            (422, r#"ResourceSlice.resource.k8s.io "n-dra.cpu-0" is invalid: spec.devices[0].name: Invalid value"#, false),
            (500, "failed to create typed patch object (...): .spec.devices[0].nodeAllocatableResources: field not declared in schema", false),
            (409, "resource.kubernetes.io/pcieRoot", false),
        ];
        for (code, message, want) in cases {
            assert_eq!(
                is_refused_pcie_roots(&status(code, message)),
                want,
                "{code} {message}"
            );
        }
        let doc = json!({"components": {"schemas": {ATTRIBUTE_SCHEMA: {"properties":
            {"string": {}, "strings": {}}}}}});
        assert!(declared_attribute_fields(&doc)
            .unwrap()
            .contains(LIST_FIELD));
        let old = json!({"components": {"schemas": {ATTRIBUTE_SCHEMA: {"properties":
            {"string": {}, "int": {}}}}}});
        assert!(!declared_attribute_fields(&old)
            .unwrap()
            .contains(LIST_FIELD));
    }

    #[test]
    fn refusals_and_dropped_sharing_are_recognised() {
        let status = |code: u16, message: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: message.to_string(),
                ..Default::default()
            }))
        };
        let refused = "failed to create typed patch object (/n-dra.cpu-0; resource.k8s.io/v1, Kind=ResourceSlice): .spec.devices[0].nodeAllocatableResources: field not declared in schema";
        assert!(is_undeclared_mapping(&status(500, refused)));
        assert!(!is_undeclared_mapping(&status(422, refused)));
        assert!(!is_undeclared_mapping(&status(
            500,
            "failed to create typed patch object (...): .spec.devices[0].other: field not declared in schema"
        )));
        let sent = build_slices("dra.cpu", "n", None, devices(DeviceMode::Grouped), 1)
            .unwrap()
            .remove(0);
        assert!(keeps_multiple_allocations(&sent, &sent));
        let mut stripped = sent.clone();
        for d in stripped.spec.devices.iter_mut().flatten() {
            d.allow_multiple_allocations = None;
        }
        assert!(!keeps_multiple_allocations(&sent, &stripped));
    }
}
