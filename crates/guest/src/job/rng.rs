//! Deterministic pseudo-random numbers: SplitMix64 (Steele, Lea and Flood,
//! 2014), small, fast and good enough for offsets and test payloads; and a
//! seeded permutation of block indices so that a random pass visits every
//! block of the range exactly once, like fio's random map.

/// The SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// A uniform number in `0..n` (`n > 0`), without modulo bias (Lemire's
    /// multiply-and-reject).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Fills `buf` with pseudo-random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&last[..n]);
    }
}

/// SplitMix64's finaliser: a bijective 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seeded permutation of `0..n`: keyed rounds of (odd multiply, add,
/// xor-shift) are each a bijection on `bits`-bit numbers, and cycle walking
/// maps the power-of-two domain back onto `0..n`.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    bits: u32,
    mask: u64,
    keys: [(u64, u64); 4],
}

impl Permutation {
    /// A permutation of `0..n` (`1 <= n <= 2^63`) chosen by `seed`.
    pub fn new(n: u64, seed: u64) -> Self {
        assert!(
            (1..=1 << 63).contains(&n),
            "permutation domain {n} out of range"
        );
        let bits = (64 - (n - 1).leading_zeros()).max(1);
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1 << bits) - 1
        };
        let mut rng = SplitMix64::new(seed);
        let keys = [(); 4].map(|()| (rng.next_u64() | 1, rng.next_u64()));
        Self {
            n,
            bits,
            mask,
            keys,
        }
    }

    fn round_trip(&self, mut x: u64) -> u64 {
        let shift = self.bits.div_ceil(2);
        for (mul, add) in self.keys {
            x = x.wrapping_mul(mul).wrapping_add(add) & self.mask;
            x ^= x >> shift;
        }
        x
    }

    /// The image of `i` (`i < n`).
    pub fn get(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut x = self.round_trip(i);
        while x >= self.n {
            x = self.round_trip(x);
        }
        x
    }

    pub fn len(&self) -> u64 {
        self.n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // First outputs of SplitMix64 seeded with 1234567 (from the
        // reference C implementation).
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
        assert_eq!(r.next_u64(), 9817491932198370423);
    }

    #[test]
    fn below_stays_below_and_covers() {
        let mut r = SplitMix64::new(7);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let v = r.below(10);
            assert!(v < 10);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn permutations_are_bijections() {
        for n in [1u64, 2, 3, 5, 7, 8, 9, 100, 1000, 1025, 4096] {
            for seed in 0..3 {
                let p = Permutation::new(n, seed);
                let mut hit = vec![false; n as usize];
                for i in 0..n {
                    let v = p.get(i);
                    assert!(v < n, "n={n} seed={seed}: {i} -> {v}");
                    assert!(!hit[v as usize], "n={n} seed={seed}: {v} twice");
                    hit[v as usize] = true;
                }
            }
        }
    }

    #[test]
    fn permutations_shuffle_and_depend_on_the_seed() {
        let n = 1000;
        let a: Vec<u64> = (0..n).map(|i| Permutation::new(n, 1).get(i)).collect();
        let b: Vec<u64> = (0..n).map(|i| Permutation::new(n, 2).get(i)).collect();
        assert_ne!(a, b);
        let fixed = a
            .iter()
            .enumerate()
            .filter(|(i, &v)| *i as u64 == v)
            .count();
        assert!(fixed < 20, "{fixed} fixed points: hardly shuffled");
        let ascending = a.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(
            ascending < 50,
            "{ascending} ascending steps: hardly shuffled"
        );
    }
}
