//! Argument conventions shared by every subcommand: sizes with K/M/G
//! suffixes (powers of 1024), comma-separated lists, ranges `A..B:STEP`.

use anyhow::{bail, Context, Result};

/// Parses a size such as `4096`, `64K`, `256M`, `1G` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => bail!("size '{s}': unknown suffix '{c}' (use K, M, G or T)"),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .with_context(|| format!("size '{s}' is not a whole number with an optional K/M/G/T suffix"))?;
    n.checked_mul(mult).with_context(|| format!("size '{s}' is too large"))
}

/// Most sizes a list may give (ranges counted out): every subcommand that
/// takes a list runs something per size.
pub const MAX_LIST: u64 = 10_000;

/// Parses a comma-separated list of sizes where each element may also be a
/// range `A..B:STEP` (inclusive of both ends when B is reached). An empty
/// element (`64M,,32M`, a trailing comma) is refused: it is a slip, and
/// skipping it silently ran one budget fewer than asked. So is a list of
/// more than [`MAX_LIST`] sizes: `1..18446744073709551615:1` looped for
/// ever (the step's addition wrapped past the end in release builds).
pub fn parse_size_list(s: &str) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    if s.trim().is_empty() {
        bail!("empty list '{s}'");
    }
    for part in s.split(',').map(str::trim) {
        if part.is_empty() {
            bail!("an empty item in the list '{s}'");
        }
        if let Some((a, rest)) = part.split_once("..") {
            let (b, step) =
                rest.split_once(':').with_context(|| format!("range '{part}' needs a step: A..B:STEP"))?;
            let (a, b, step) = (parse_size(a)?, parse_size(b)?, parse_size(step)?);
            if step == 0 || a > b {
                bail!("range '{part}': need A <= B and STEP > 0");
            }
            // (b - a) / step + 1 sizes, counted without overflow.
            let n = (b - a) / step;
            if n >= MAX_LIST || out.len() as u64 + n >= MAX_LIST {
                bail!(
                    "range '{part}' gives {} sizes, and a list may give at most {MAX_LIST}: use a larger STEP",
                    u128::from(n) + 1
                );
            }
            out.extend((0..=n).map(|i| a + i * step));
        } else {
            out.push(parse_size(part)?);
        }
        if out.len() as u64 > MAX_LIST {
            bail!("the list '{s}' gives more than {MAX_LIST} sizes");
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_ranges() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("256m").unwrap(), 256 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("abc").is_err());
        assert_eq!(parse_size_list("8M..24M:8M").unwrap(), vec![8 << 20, 16 << 20, 24 << 20]);
        assert_eq!(parse_size_list("1K,2K").unwrap(), vec![1024, 2048]);
        assert!(parse_size_list("8M..4M:1M").is_err());
        assert!(parse_size_list("1M..2M").is_err());
        for slip in ["64M,,32M", "64M,", ",64M", "", " "] {
            assert!(parse_size_list(slip).is_err(), "{slip:?}");
        }
        // Up to the very top of u64, exactly (the last step ends on it).
        let top = u64::MAX;
        assert_eq!(parse_size_list(&format!("{}..{top}:1", top - 2)).unwrap(), vec![top - 2, top - 1, top]);
        assert_eq!(parse_size_list(&format!("1..{top}:{}", top / 2)).unwrap(), vec![1, top / 2 + 1, top]);
        assert_eq!(parse_size_list(&format!("{top}..{top}:1")).unwrap(), vec![top]);
    }

    /// A range of more sizes than a list may give is refused at once,
    /// naming its count, near `u64::MAX` too (it looped for ever: the
    /// step's addition wrapped past the end); so is a list whose items
    /// add up past the limit. The limit itself is allowed.
    #[test]
    fn a_list_of_too_many_sizes_is_refused_at_once() {
        let t = std::time::Instant::now();
        let e = parse_size_list("1..18446744073709551615:1").unwrap_err().to_string();
        assert!(e.contains("gives 18446744073709551615 sizes") && e.contains("at most 10000"), "{e}");
        let e = parse_size_list("0..18446744073709551615:1").unwrap_err().to_string();
        assert!(e.contains("gives 18446744073709551616 sizes"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(parse_size_list("1..10000:1").unwrap().len(), 10_000);
        assert!(parse_size_list("1..10001:1").is_err());
        assert!(parse_size_list("1..5000:1,1..5001:1").is_err());
        let many = vec!["1"; 10_001].join(",");
        assert!(parse_size_list(&many).unwrap_err().to_string().contains("more than 10000"));
    }
}
