//! Rendering a prepared claim's metadata files: the `DeviceMetadata`
//! JSON stream per request, its host path and its path in the container
//! (the format is described in the parent module).

use super::{
    base_request, check_names, ClaimMetadata, DeviceMetadata, MetadataError, MetadataFile,
    API_VERSIONS, ATTR_ALLOCATED_NUM_CPUS, ATTR_CPUS, CONTAINER_DIR, HOST_FILE_NAME, KIND,
    RESOURCE_CLAIMS_SUBDIR, RESOURCE_CLAIM_TEMPLATES_SUBDIR,
};
use k8s_openapi::api::resource::v1::DeviceAttribute;
use serde::Serialize;
use shared_state::{ClaimAssignment, CpuSet};
use std::collections::BTreeMap;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: ObjectMeta<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<&'a str>,
    requests: Vec<Request<'a>>,
}

#[derive(Serialize)]
struct ObjectMeta<'a> {
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
    generation: i64,
}

#[derive(Serialize)]
struct Request<'a> {
    name: &'a str,
    devices: Vec<MetaDevice<'a>>,
}

#[derive(Serialize)]
struct MetaDevice<'a> {
    driver: &'a str,
    pool: &'a str,
    name: &'a str,
    attributes: BTreeMap<String, DeviceAttribute>,
}

impl DeviceMetadata {
    /// The attributes of one allocated device of a claim holding `cpus`.
    fn device_attributes(
        &self,
        device: &shared_state::AllocatedDevice,
        cpus: &CpuSet,
    ) -> BTreeMap<String, DeviceAttribute> {
        let mut attributes = self
            .attributes
            .get(&device.device)
            .cloned()
            .unwrap_or_default();
        let on_device = self
            .device_cpus
            .get(&device.device)
            .map(|d| d.intersection(cpus))
            .unwrap_or_default();
        let allocated = device
            .consumed_cpus
            .map_or(on_device.len() as i64, i64::from);
        attributes.insert(
            ATTR_ALLOCATED_NUM_CPUS.to_string(),
            DeviceAttribute {
                int: Some(allocated),
                ..Default::default()
            },
        );
        attributes.insert(
            ATTR_CPUS.to_string(),
            DeviceAttribute {
                string: Some(on_device.to_cpulist()),
                ..Default::default()
            },
        );
        attributes
    }

    /// The files of a prepared claim. Refused (before anything is written)
    /// if a name of the claim cannot be a path segment.
    pub fn render(&self, claim: &ClaimAssignment) -> Result<ClaimMetadata, MetadataError> {
        check_names(claim)?;
        let pod_claim_name = claim.pod_claim_name.as_deref().filter(|n| !n.is_empty());
        // Requests in allocation order, each with its devices.
        let mut requests: Vec<(&str, &str, Vec<&shared_state::AllocatedDevice>)> = Vec::new();
        for device in &claim.devices {
            let base = base_request(&device.request);
            match requests.iter_mut().find(|(b, _, _)| *b == base) {
                Some((_, _, devices)) => devices.push(device),
                None => requests.push((base, &device.request, vec![device])),
            }
        }
        let claim_dir = self.claim_dir(&claim.namespace, &claim.name);
        let (subdir, claim_segment) = match pod_claim_name {
            Some(n) => (RESOURCE_CLAIM_TEMPLATES_SUBDIR, n),
            None => (RESOURCE_CLAIMS_SUBDIR, claim.name.as_str()),
        };
        let files = requests
            .into_iter()
            .map(|(base, reference, devices)| {
                let devices: Vec<MetaDevice> = devices
                    .into_iter()
                    .map(|d| MetaDevice {
                        driver: &self.driver_name,
                        pool: &d.pool,
                        name: &d.device,
                        attributes: self.device_attributes(d, &claim.cpus),
                    })
                    .collect();
                let mut body = Vec::new();
                let mut document = Document {
                    kind: KIND,
                    api_version: API_VERSIONS[0],
                    metadata: ObjectMeta {
                        name: &claim.name,
                        namespace: &claim.namespace,
                        uid: &claim.claim_uid,
                        generation: 1,
                    },
                    pod_claim_name,
                    requests: vec![Request {
                        name: reference,
                        devices,
                    }],
                };
                for version in API_VERSIONS {
                    document.api_version = version;
                    // Strings, numbers and maps of them always serialize.
                    body.extend(serde_json::to_vec_pretty(&document).unwrap_or_default());
                    body.push(b'\n');
                }
                MetadataFile {
                    host_path: claim_dir.join(base).join(HOST_FILE_NAME),
                    container_path: format!(
                        "{CONTAINER_DIR}/{subdir}/{claim_segment}/{base}/{}-metadata.json",
                        self.driver_name
                    ),
                    body,
                }
            })
            .collect();
        Ok(ClaimMetadata { claim_dir, files })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use shared_state::cdi_spec::Mount;
    use std::path::Path;

    #[test]
    fn a_grouped_claim_renders_the_golden_file() {
        let m = metadata(Path::new("/var/lib/kubelet/plugins/dra.cpu"));
        let rendered = m
            .render(&claim(&[("cpus", "cpudevnuma000", Some(2))], "2-3"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rendered.files.len(), 1);
        let file = &rendered.files[0];
        assert_eq!(
            file.host_path,
            Path::new(
                "/var/lib/kubelet/plugins/dra.cpu/dra-device-metadata/team_web-cpu/cpus/metadata.json"
            )
        );
        assert_eq!(
            file.container_path,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/web-cpu/cpus/dra.cpu-metadata.json"
        );
        let object = |version: &str| {
            format!(
                r#"{{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/{version}",
  "metadata": {{
    "name": "web-cpu",
    "namespace": "team",
    "uid": "{UID}",
    "generation": 1
  }},
  "requests": [
    {{
      "name": "cpus",
      "devices": [
        {{
          "driver": "dra.cpu",
          "pool": "node-a",
          "name": "cpudevnuma000",
          "attributes": {{
            "dra.cpu/allocatedNumCPUs": {{
              "int": 2
            }},
            "dra.cpu/cpus": {{
              "string": "2-3"
            }},
            "dra.cpu/numCPUs": {{
              "int": 8
            }},
            "dra.cpu/smtEnabled": {{
              "bool": true
            }},
            "resource.kubernetes.io/numaNode": {{
              "int": 0
            }}
          }}
        }}
      ]
    }}
  ]
}}
"#
            )
        };
        let golden = format!("{}{}", object("v1beta1"), object("v1alpha1"));
        assert_eq!(String::from_utf8_lossy(&file.body), golden);
        assert_eq!(
            rendered.mounts(),
            vec![Mount::read_only_file(
                "/var/lib/kubelet/plugins/dra.cpu/dra-device-metadata/team_web-cpu/cpus/metadata.json",
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/web-cpu/cpus/dra.cpu-metadata.json",
            )]
        );
    }

    #[test]
    fn template_claims_subrequests_and_individual_devices() {
        let m = metadata(Path::new("/p"));
        let mut c = claim(
            &[
                ("big/two", "cpudev005", None),
                ("small", "cpudevnuma001", Some(1)),
            ],
            "5,9",
        );
        c.pod_claim_name = Some("cpu".into());
        let rendered = m.render(&c).unwrap_or_else(|e| panic!("{e}"));
        let paths: Vec<(&Path, &str)> = rendered
            .files
            .iter()
            .map(|f| (f.host_path.as_path(), f.container_path.as_str()))
            .collect();
        assert_eq!(
            paths,
            vec![
                (
                    Path::new("/p/dra-device-metadata/team_web-cpu/big/metadata.json"),
                    "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/cpu/big/dra.cpu-metadata.json"
                ),
                (
                    Path::new("/p/dra-device-metadata/team_web-cpu/small/metadata.json"),
                    "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/cpu/small/dra.cpu-metadata.json"
                ),
            ]
        );
        let big = objects(&rendered.files[0].body);
        assert_eq!(big.len(), 2, "one object per version");
        assert_eq!(big[0]["apiVersion"], "metadata.resource.k8s.io/v1beta1");
        assert_eq!(big[1]["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
        assert_eq!(big[0]["podClaimName"], "cpu");
        // The content names the full request reference.
        assert_eq!(big[0]["requests"][0]["name"], "big/two");
        let attrs = &big[0]["requests"][0]["devices"][0]["attributes"];
        assert_eq!(attrs["dra.cpu/cpuID"]["int"], 5);
        assert_eq!(attrs["dra.cpu/cpus"]["string"], "5");
        // An individual device counts its own CPU.
        assert_eq!(attrs["dra.cpu/allocatedNumCPUs"]["int"], 1);
        let small = objects(&rendered.files[1].body);
        let attrs = &small[0]["requests"][0]["devices"][0]["attributes"];
        // A device not in the published list still gets this driver's two.
        assert_eq!(attrs["dra.cpu/cpus"]["string"], "9");
        assert_eq!(attrs["dra.cpu/allocatedNumCPUs"]["int"], 1);
    }

    #[test]
    fn two_devices_of_one_request_share_its_file() {
        let m = metadata(Path::new("/p"));
        let rendered = m
            .render(&claim(
                &[
                    ("cpus", "cpudevnuma000", Some(1)),
                    ("cpus", "cpudevnuma001", Some(2)),
                ],
                "0,8-9",
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rendered.files.len(), 1);
        let doc = &objects(&rendered.files[0].body)[0];
        let devices = doc["requests"][0]["devices"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let cpus: Vec<(&str, &str, i64)> = devices
            .iter()
            .map(|d| {
                (
                    d["name"].as_str().unwrap_or_default(),
                    d["attributes"]["dra.cpu/cpus"]["string"]
                        .as_str()
                        .unwrap_or_default(),
                    d["attributes"]["dra.cpu/allocatedNumCPUs"]["int"]
                        .as_i64()
                        .unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            cpus,
            vec![("cpudevnuma000", "0", 1), ("cpudevnuma001", "8-9", 2)]
        );
    }

    #[test]
    fn names_that_are_not_path_segments_are_refused() {
        let m = metadata(Path::new("/p"));
        let good = claim(&[("cpus", "cpudevnuma000", Some(1))], "0");
        let cases: Vec<(ClaimAssignment, &str)> = vec![
            (
                ClaimAssignment {
                    namespace: "..".into(),
                    ..good.clone()
                },
                "namespace \"..\"",
            ),
            (
                ClaimAssignment {
                    name: "a/b".into(),
                    ..good.clone()
                },
                "name \"a/b\"",
            ),
            (
                ClaimAssignment {
                    pod_claim_name: Some("x/../../etc".into()),
                    ..good.clone()
                },
                "pod claim name",
            ),
            (
                claim(&[("", "cpudevnuma000", Some(1))], "0"),
                "request \"\"",
            ),
            (
                claim(&[("../x/y", "cpudevnuma000", Some(1))], "0"),
                "request \"..\"",
            ),
        ];
        for (c, want) in cases {
            match m.render(&c) {
                Err(e) => assert!(e.to_string().contains(want), "{e} lacks {want}"),
                Ok(r) => panic!("{want}: rendered {:?}", r.claim_dir),
            }
        }
        assert!(m.render(&good).is_ok());
    }
}
