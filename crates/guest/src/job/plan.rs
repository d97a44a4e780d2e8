//! What to issue next: the workload's sequence of (operation, block), and
//! when to stop. [`MainPlan`] follows the spec's pattern until its size or
//! runtime is used up; [`ReadBack`] reads every block with an acknowledged
//! write once.
//!
//! Random patterns walk a seeded permutation of the blocks, a new one per
//! pass, so a pass touches every block exactly once (fio's random map);
//! reads and writes of `randrw` walk separate permutations so that reads
//! find blocks written earlier.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::rng::{mix64, Permutation, SplitMix64};
use super::spec::RwMode;

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
}

/// One I/O to issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub kind: IoKind,
    pub block: u64,
}

/// A source of I/Os.
pub trait Plan {
    /// The next I/O, or `None` once the plan is over.
    fn next(&mut self, now: Instant) -> Option<Planned>;
    /// The plan ended early (runtime or stop request): I/Os planned but
    /// not yet issued should be dropped.
    fn cut_short(&self) -> bool;
}

/// A pass-by-pass walk over seeded permutations of `0..n`.
#[derive(Debug, Clone)]
struct Walk {
    seed: u64,
    pass: u64,
    idx: u64,
    perm: Permutation,
}

impl Walk {
    fn new(n: u64, seed: u64) -> Self {
        Self {
            seed,
            pass: 0,
            idx: 0,
            perm: Permutation::new(n, mix64(seed)),
        }
    }

    fn next(&mut self) -> u64 {
        if self.idx == self.perm.len() {
            self.pass += 1;
            self.idx = 0;
            self.perm = Permutation::new(self.perm.len(), mix64(self.seed ^ mix64(self.pass)));
        }
        let b = self.perm.get(self.idx);
        self.idx += 1;
        b
    }
}

/// The spec's workload.
#[derive(Debug)]
pub struct MainPlan {
    mode: RwMode,
    rwmixread: u8,
    blocks: u64,
    remaining: u64,
    deadline: Option<Instant>,
    stop: Option<Arc<AtomicBool>>,
    mix: SplitMix64,
    reads: Walk,
    writes: Walk,
    seq: u64,
    cut: bool,
}

impl MainPlan {
    /// `ios` I/Os over `blocks` blocks, ending early at `deadline` or when
    /// `stop` is set.
    pub fn new(
        mode: RwMode,
        rwmixread: u8,
        blocks: u64,
        ios: u64,
        seed: u64,
        deadline: Option<Instant>,
        stop: Option<Arc<AtomicBool>>,
    ) -> Self {
        Self {
            mode,
            rwmixread,
            blocks,
            remaining: ios,
            deadline,
            stop,
            mix: SplitMix64::new(mix64(seed ^ 0x006d_6978)),
            reads: Walk::new(blocks, seed),
            writes: Walk::new(blocks, seed ^ 0x7772_6974_6573),
            seq: 0,
            cut: false,
        }
    }
}

fn stopped(stop: &Option<Arc<AtomicBool>>) -> bool {
    stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed))
}

impl Plan for MainPlan {
    fn next(&mut self, now: Instant) -> Option<Planned> {
        if self.remaining == 0 || self.cut {
            return None;
        }
        if self.deadline.is_some_and(|d| now >= d) || stopped(&self.stop) {
            self.cut = true;
            return None;
        }
        self.remaining -= 1;
        let kind = match self.mode {
            RwMode::Read | RwMode::RandRead => IoKind::Read,
            RwMode::Write | RwMode::RandWrite => IoKind::Write,
            RwMode::RandRw if self.mix.below(100) < u64::from(self.rwmixread) => IoKind::Read,
            RwMode::RandRw => IoKind::Write,
        };
        let block = if self.mode.random() {
            match kind {
                IoKind::Read => self.reads.next(),
                IoKind::Write => self.writes.next(),
            }
        } else {
            let b = self.seq;
            self.seq = (self.seq + 1) % self.blocks;
            b
        };
        Some(Planned { kind, block })
    }

    fn cut_short(&self) -> bool {
        self.cut
    }
}

/// Reads each listed block once, in order.
#[derive(Debug)]
pub struct ReadBack {
    blocks: std::vec::IntoIter<u64>,
    stop: Option<Arc<AtomicBool>>,
    cut: bool,
}

impl ReadBack {
    pub fn new(blocks: Vec<u64>, stop: Option<Arc<AtomicBool>>) -> Self {
        Self {
            blocks: blocks.into_iter(),
            stop,
            cut: false,
        }
    }
}

impl Plan for ReadBack {
    fn next(&mut self, _now: Instant) -> Option<Planned> {
        if self.cut || stopped(&self.stop) {
            self.cut = true;
            return None;
        }
        self.blocks.next().map(|block| Planned {
            kind: IoKind::Read,
            block,
        })
    }

    fn cut_short(&self) -> bool {
        self.cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(p: &mut dyn Plan) -> Vec<Planned> {
        let now = Instant::now();
        std::iter::from_fn(|| p.next(now)).collect()
    }

    #[test]
    fn random_pass_covers_every_block_once_and_seed_decides() {
        let mut p = MainPlan::new(RwMode::RandWrite, 50, 1000, 1000, 5, None, None);
        let v = drain(&mut p);
        let mut blocks: Vec<u64> = v.iter().map(|x| x.block).collect();
        let order = blocks.clone();
        blocks.sort_unstable();
        assert_eq!(blocks, (0..1000).collect::<Vec<_>>());
        assert!(v.iter().all(|x| x.kind == IoKind::Write));
        let again: Vec<u64> = drain(&mut MainPlan::new(
            RwMode::RandWrite,
            50,
            1000,
            1000,
            5,
            None,
            None,
        ))
        .iter()
        .map(|x| x.block)
        .collect();
        assert_eq!(order, again, "same seed, same order");
        let other: Vec<u64> = drain(&mut MainPlan::new(
            RwMode::RandWrite,
            50,
            1000,
            1000,
            6,
            None,
            None,
        ))
        .iter()
        .map(|x| x.block)
        .collect();
        assert_ne!(order, other);
        assert_ne!(order, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn second_pass_is_a_new_permutation() {
        let v: Vec<u64> = drain(&mut MainPlan::new(
            RwMode::RandRead,
            50,
            100,
            200,
            1,
            None,
            None,
        ))
        .iter()
        .map(|x| x.block)
        .collect();
        let (a, b) = v.split_at(100);
        assert_ne!(a, b);
        let mut b = b.to_vec();
        b.sort_unstable();
        assert_eq!(b, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn sequential_wraps_and_mix_follows_rwmixread() {
        let v = drain(&mut MainPlan::new(RwMode::Read, 50, 3, 7, 1, None, None));
        assert_eq!(
            v.iter().map(|x| x.block).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2, 0]
        );
        let v = drain(&mut MainPlan::new(
            RwMode::RandRw,
            70,
            1000,
            10_000,
            1,
            None,
            None,
        ));
        let reads = v.iter().filter(|x| x.kind == IoKind::Read).count();
        assert!(
            (6_500..7_500).contains(&reads),
            "{reads} reads of 10000 at rwmixread=70"
        );
        let v = drain(&mut MainPlan::new(
            RwMode::RandRw,
            0,
            10,
            100,
            1,
            None,
            None,
        ));
        assert!(v.iter().all(|x| x.kind == IoKind::Write));
    }

    #[test]
    fn deadline_and_stop_cut_the_plan_short() {
        let past = Instant::now();
        let mut p = MainPlan::new(RwMode::RandRead, 50, 10, 100, 1, Some(past), None);
        assert_eq!(p.next(Instant::now()), None);
        assert!(p.cut_short());
        let stop = Arc::new(AtomicBool::new(false));
        let mut p = MainPlan::new(RwMode::RandRead, 50, 10, 100, 1, None, Some(stop.clone()));
        assert!(p.next(Instant::now()).is_some());
        stop.store(true, Ordering::Relaxed);
        assert_eq!(p.next(Instant::now()), None);
        assert!(p.cut_short());
        let mut r = ReadBack::new(vec![4, 2], None);
        assert_eq!(
            drain(&mut r).iter().map(|x| x.block).collect::<Vec<_>>(),
            [4, 2]
        );
        assert!(!r.cut_short());
    }
}
