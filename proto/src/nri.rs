//! NRI bindings (ttrpc) and the NRI plugin client.
