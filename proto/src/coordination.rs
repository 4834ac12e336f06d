//! The dra-plugin/nri-plugin coordination protocol `dracpu.v1` (tonic).
