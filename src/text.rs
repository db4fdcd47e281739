//! Words that agree with their numbers, for the messages on stderr: "1
//! block has", "2 blocks have".

/// `one` when `n` is 1, else `many`: a noun, or a verb or pronoun that
/// agrees with a count (`noun(n, "has", "have")`).
pub fn noun(n: u64, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// `n` and the noun that agrees with it: `"1 block"`, `"2 blocks"`, `"0
/// blocks"`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees() {
        assert_eq!(count(1u64, "block", "blocks"), "1 block");
        assert_eq!(count(2u32, "block", "blocks"), "2 blocks");
        assert_eq!(count(0u8, "block", "blocks"), "0 blocks");
        assert_eq!(noun(1, "has", "have"), "has");
        assert_eq!(noun(3, "has", "have"), "have");
    }
}
