//! `must`: unwrap in a test with the error's text (not its Debug form) and
//! what was being done, so a failed step reads as a sentence.

use std::fmt::Display;

/// Unwraps with the error's text (not its Debug form) and what was being done.
pub trait Must<T> {
    fn must(self, what: &str) -> T;
}

impl<T, E: Display> Must<T> for Result<T, E> {
    fn must(self, what: &str) -> T {
        match self {
            Ok(v) => v,
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ok_is_unwrapped() {
        assert_eq!(Ok::<u8, String>(7).must("seven"), 7);
    }

    #[test]
    #[should_panic(expected = "reading the file: gone")]
    fn err_panics_with_what_and_the_error_text() {
        Err::<u8, String>("gone".into()).must("reading the file");
    }
}
