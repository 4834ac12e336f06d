//! NRI bindings (ttrpc, rust-protobuf 3), generated from
//! `proto/nri/api.proto` (`nri.pkg.api.v1alpha1`, a superset understood by
//! NRI 0.6 to 0.12): [`api`] (messages) and [`api_ttrpc`] (services). The
//! client that speaks them is the `dra-cpu-nri` crate.

/// A module of code generated into `OUT_DIR`, under the generator's lints
/// rather than ours.
macro_rules! generated_module {
    ($(#[$doc:meta])* $name:ident, $file:literal) => {
        $(#[$doc])*
        #[allow(
            clippy::all,
            clippy::pedantic,
            // Generated code unwraps its own embedded descriptor, not peer input.
            clippy::unwrap_used,
            clippy::expect_used,
            missing_docs,
            unused,
            non_camel_case_types,
            non_snake_case,
            non_upper_case_globals,
            unreachable_pub,
            rustdoc::all,
            deprecated
        )]
        pub mod $name {
            include!(concat!(env!("OUT_DIR"), $file));
        }
    };
}

generated_module!(
    /// Generated rust-protobuf messages of `nri.pkg.api.v1alpha1`.
    api,
    "/nri/api.rs"
);

generated_module!(
    /// Generated async ttrpc client and server glue for `Runtime` and `Plugin`.
    api_ttrpc,
    "/nri/api_ttrpc.rs"
);
