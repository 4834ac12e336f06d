//! Protobuf from a hostile peer, proptest-driven and bounded for CI: NRI
//! requests and coordination messages either decode or are refused; none
//! panics, and what decodes re-encodes to the same message.
//!
//! `DRA_CPU_FUZZ_CASES` sets the cases (256 by default).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_proto::coordination::v1 as coord;
use dra_cpu_proto::nri::api;
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("DRA_CPU_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn protobuf_messages_take_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        use protobuf::Message as _;
        let _ = api::CreateContainerRequest::parse_from_bytes(&bytes);
        let _ = api::SynchronizeRequest::parse_from_bytes(&bytes);
        let _ = api::ConfigureRequest::parse_from_bytes(&bytes);
        let _ = api::StateChangeEvent::parse_from_bytes(&bytes);
        let _ = api::UpdateContainerRequest::parse_from_bytes(&bytes);
        use prost::Message as _;
        if let Ok(event) = coord::WatchEvent::decode(&bytes[..]) {
            let again = coord::WatchEvent::decode(&event.encode_to_vec()[..]);
            prop_assert_eq!(again.ok(), Some(event));
        }
        let _ = coord::LookupResponse::decode(&bytes[..]);
        let _ = coord::WatchRequest::decode(&bytes[..]);
    }
}
