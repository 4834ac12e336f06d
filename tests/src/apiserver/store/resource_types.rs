//! The resource types the server knows.

/// How a write treats the status of resources that have a status subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
}

/// A resource type the server knows (what discovery lists).
#[derive(Debug)]
pub struct ResourceType {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub has_status: bool,
    /// Field labels accepted by `fieldSelector` besides metadata.name/namespace.
    pub selectable_fields: &'static [&'static str],
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// What the resource's field label conversion accepts: `metadata.name`
    /// everywhere, `metadata.namespace` only on namespaced resources
    /// (`generic.ObjectMetaFieldsSet`), and the type's own fields
    /// (ResourceSlices: `spec.nodeName` and `spec.driver`, resourceslice
    /// `strategy.go` `toSelectableFields`).
    pub fn supported_fields(&self) -> Vec<&'static str> {
        let mut fields = vec!["metadata.name"];
        if self.namespaced {
            fields.push("metadata.namespace");
        }
        fields.extend_from_slice(self.selectable_fields);
        fields
    }
}

pub const NODES: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "nodes",
    singular: "node",
    kind: "Node",
    namespaced: false,
    has_status: true,
    selectable_fields: &["spec.unschedulable"],
};
pub const RESOURCE_SLICES: ResourceType = ResourceType {
    group: "resource.k8s.io",
    version: "v1",
    plural: "resourceslices",
    singular: "resourceslice",
    kind: "ResourceSlice",
    namespaced: false,
    has_status: false,
    selectable_fields: &["spec.nodeName", "spec.driver"],
};
pub const RESOURCE_CLAIMS: ResourceType = ResourceType {
    group: "resource.k8s.io",
    version: "v1",
    plural: "resourceclaims",
    singular: "resourceclaim",
    kind: "ResourceClaim",
    namespaced: true,
    has_status: true,
    selectable_fields: &[],
};
pub const DEVICE_CLASSES: ResourceType = ResourceType {
    group: "resource.k8s.io",
    version: "v1",
    plural: "deviceclasses",
    singular: "deviceclass",
    kind: "DeviceClass",
    namespaced: false,
    has_status: false,
    selectable_fields: &[],
};

pub const RESOURCE_TYPES: [&ResourceType; 4] =
    [&NODES, &RESOURCE_SLICES, &RESOURCE_CLAIMS, &DEVICE_CLASSES];

pub fn find_type(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCE_TYPES
        .into_iter()
        .find(|t| t.group == group && t.version == version && t.plural == plural)
}
