//! The YAML config file both daemons read: one reader, one YAML crate, one
//! set of errors.
//!
//! A file is read whole and deserialized into the daemon's own settings
//! type. An empty file (or one holding only comments) is a valid "no
//! settings" file and gives the type's defaults. Unknown keys are refused
//! by the settings types themselves (`#[serde(deny_unknown_fields)]`); the
//! error then names the file and the key.
//!
//! The YAML is read as serde_yaml 0.9 read it: YAML 1.2 core booleans only
//! (`yes`/`on` are strings, not `true`), a repeated key refused.

use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// Why a config file could not be read into settings.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Parse {
        path: PathBuf,
        // Boxed: the reader's error is large, and every Result carries it.
        #[source]
        source: Box<serde_saphyr::Error>,
    },
}

/// The reader's options: the YAML 1.2 booleans serde_yaml 0.9 accepted,
/// and one-line errors (operators read them in a log line).
fn options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    options.with_snippet = false;
    options
}

/// Deserialize YAML text into `T` with the config file's rules; the text
/// need not come from a file (a test's, an HTTP body).
pub fn from_yaml<T: DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(text, options())
}

/// Parse a config file's text; `path` only names the file in errors.
pub fn parse<T: DeserializeOwned + Default>(path: &Path, text: &str) -> Result<T, ConfigFileError> {
    // An empty document is null, which `Option` reads as "no settings".
    from_yaml::<Option<T>>(text)
        .map(Option::unwrap_or_default)
        .map_err(|source| ConfigFileError::Parse {
            path: path.to_path_buf(),
            source: Box::new(source),
        })
}

/// Read a config file's text.
pub fn read(path: &Path) -> Result<String, ConfigFileError> {
    std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Read and parse a config file.
pub fn load<T: DeserializeOwned + Default>(path: &Path) -> Result<T, ConfigFileError> {
    parse(path, &read(path)?)
}

/// Declares a daemon's settings type, read from flags and from the config
/// file alike: every field is an optional `--long` flag and the file key of
/// the same name without the dashes (kebab-case; an unknown key is refused),
/// so that a flag given wins over the file, the file over the default.
///
/// A field is written `pub name: Option<Type>,`; `#[arg(long)]` is added, so
/// no flag can be left without its key; its doc comment is its help, and
/// further `#[arg(..)]` attributes pass through. `or` layers two settings:
/// every field set in the first, else the second's.
///
/// The expansion derives `clap::Args` and `serde::Deserialize`: the caller
/// depends on `clap` and `serde`.
#[macro_export]
macro_rules! layered_settings {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                pub $field:ident: $ty:ty,
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, ::clap::Args, ::serde::Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "kebab-case")]
        pub struct $name {
            $(
                $(#[$field_meta])*
                #[arg(long)]
                pub $field: $ty,
            )*
        }

        impl $name {
            /// Every field set here, else the one from `fallback`.
            pub fn or(self, fallback: $name) -> $name {
                $name {
                    $($field: self.$field.or(fallback.$field),)*
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Default, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    struct Settings {
        node_name: Option<String>,
        allowed_uids: Option<Vec<u32>>,
        enabled: Option<bool>,
    }

    const PATH: &str = "/etc/dra-cpu/config.yaml";

    fn parse_text(text: &str) -> Result<Settings, ConfigFileError> {
        parse(Path::new(PATH), text)
    }

    #[test]
    fn empty_and_comment_only_files_are_the_defaults() {
        for text in ["", "  \n", "# nothing set\n", "---\n"] {
            match parse_text(text) {
                Ok(settings) => assert_eq!(settings, Settings::default(), "{text:?}"),
                Err(e) => panic!("{text:?}: {e}"),
            }
        }
    }

    #[test]
    fn keys_are_read_into_the_settings() {
        let settings =
            parse_text("node-name: n1\nallowed-uids: [0, 1000]\nenabled: true\n").expect("parses");
        assert_eq!(
            settings,
            Settings {
                node_name: Some("n1".into()),
                allowed_uids: Some(vec![0, 1000]),
                enabled: Some(true),
            }
        );
    }

    #[test]
    fn refusals_name_the_file_and_the_problem() {
        let cases = [
            ("node-nme: n1\n", "node-nme"),
            ("node-name: a\nnode-name: b\n", "duplicate"),
            // YAML 1.1's booleans are not booleans, as in serde_yaml 0.9.
            ("enabled: yes\n", "invalid boolean"),
            ("allowed-uids: [-1]\n", "invalid u32"),
            ("- a\n", "expected mapping"),
            ("node-name: [unclosed\n", PATH),
        ];
        for (text, fragment) in cases {
            match parse_text(text) {
                Ok(s) => panic!("{text:?} parsed as {s:?}"),
                Err(e @ ConfigFileError::Parse { .. }) => {
                    let message = e.to_string();
                    assert!(
                        message.starts_with(&format!("config file {PATH}: ")),
                        "{message}"
                    );
                    assert!(message.contains(fragment), "{text:?}: {message}");
                    assert!(!message.contains('\n'), "one line: {message}");
                }
                Err(e) => panic!("{text:?}: {e:?}"),
            }
        }
    }

    #[test]
    fn a_missing_file_is_a_read_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("absent.yaml");
        match load::<Settings>(&path) {
            Err(e @ ConfigFileError::Read { .. }) => {
                assert!(e.to_string().contains(&path.display().to_string()), "{e}")
            }
            other => panic!("{other:?}"),
        }
        std::fs::write(&path, "enabled: false\n").expect("write");
        assert_eq!(load::<Settings>(&path).expect("loads").enabled, Some(false));
    }
}
