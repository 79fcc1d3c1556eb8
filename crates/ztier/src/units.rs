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

/// Parses a comma-separated list of sizes where each element may also be a
/// range `A..B:STEP` (inclusive of both ends when B is reached). An empty
/// element (`64M,,32M`, a trailing comma) is refused: it is a slip, and
/// skipping it silently ran one budget fewer than asked.
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
            let mut x = a;
            while x <= b {
                out.push(x);
                x += step;
            }
        } else {
            out.push(parse_size(part)?);
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
    }
}
