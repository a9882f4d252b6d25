//! The in-flight table against an obviously correct model: a vector with one state
//! per offset, scanned on every question. Random sequences of reserves, acks,
//! extends, nacks (live and stale handles), time steps, purges, high-watermark
//! growth, retention jumps, corrupt skips and rebuilds from the persisted pair must
//! give the same answers and the same settled state after every step.

use proptest::prelude::*;

use super::*;

/// Offsets the model tracks; every operation stays below this.
const OFFSETS: u64 = 64;
const HWM_MAX: u64 = 48;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Free,
    Leased { nonce: u64, expiry_ms: u64 },
    Settled,
}

#[derive(Clone, Debug)]
enum Op {
    Reserve { visibility_ms: u64 },
    Ack { pick: usize, forged: bool },
    Extend { pick: usize, visibility_ms: u64 },
    Nack { pick: usize },
    Advance { ms: u64 },
    Purge,
    Grow { records: u64 },
    Jump { to: u64 },
    Skip { start: u64, len: u64 },
    Crash { junk: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..60u64).prop_map(|visibility_ms| Op::Reserve { visibility_ms }),
        4 => (any::<usize>(), prop::bool::weighted(0.1))
            .prop_map(|(pick, forged)| Op::Ack { pick, forged }),
        1 => (any::<usize>(), 1..60u64)
            .prop_map(|(pick, visibility_ms)| Op::Extend { pick, visibility_ms }),
        1 => any::<usize>().prop_map(|pick| Op::Nack { pick }),
        2 => (0..30u64).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Purge),
        2 => (0..6u64).prop_map(|records| Op::Grow { records }),
        1 => (0..HWM_MAX).prop_map(|to| Op::Jump { to }),
        1 => (0..HWM_MAX + 8, 0..6u64).prop_map(|(start, len)| Op::Skip { start, len }),
        1 => any::<bool>().prop_map(|junk| Op::Crash { junk }),
    ]
}

struct Model {
    slots: Vec<Slot>,
}

impl Model {
    fn frontier(&self) -> Offset {
        let first = self.slots.iter().position(|s| *s != Slot::Settled);
        Offset(first.expect("the model ran out of offsets") as u64)
    }

    fn acked_ahead(&self) -> Vec<Offset> {
        let frontier = self.frontier().0;
        (frontier..OFFSETS)
            .filter(|&o| self.slots[o as usize] == Slot::Settled)
            .map(Offset)
            .collect()
    }

    fn leased(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.slots.iter().filter_map(|s| match *s {
            Slot::Leased { nonce, expiry_ms } => Some((nonce, expiry_ms)),
            _ => None,
        })
    }

    fn purge(&mut self, now_ms: u64) {
        for slot in &mut self.slots {
            if matches!(*slot, Slot::Leased { expiry_ms, .. } if expiry_ms <= now_ms) {
                *slot = Slot::Free;
            }
        }
    }

    fn reserve(&mut self, now_ms: u64, hwm: u64, caps: &Caps, vis: u64, nonce: u64) -> Reserve {
        self.purge(now_ms);
        if self.leased().count() >= caps.in_flight_max {
            return Reserve::Full;
        }
        let frontier = self.frontier().0;
        let Some(offset) = (frontier..hwm).find(|&o| self.slots[o as usize] == Slot::Free) else {
            return Reserve::Empty;
        };
        if self.acked_ahead().len() >= caps.acked_ahead_max && offset != frontier {
            return Reserve::Full;
        }
        let expiry_ms = now_ms + vis;
        self.slots[offset as usize] = Slot::Leased { nonce, expiry_ms };
        Reserve::Reserved {
            offset: Offset(offset),
            expiry_ms,
        }
    }

    /// Purges, then applies `then` to the slot if `(offset, nonce)` is leased there.
    fn handle(&mut self, offset: Offset, nonce: u64, now_ms: u64, then: Slot) -> bool {
        self.purge(now_ms);
        let slot = &mut self.slots[offset.0 as usize];
        match *slot {
            Slot::Leased { nonce: n, .. } if n == nonce => {
                *slot = then;
                true
            }
            _ => false,
        }
    }

    fn available(&self, hwm: u64) -> u64 {
        let frontier = self.frontier().0;
        (frontier..hwm.max(frontier))
            .filter(|&o| self.slots[o as usize] == Slot::Free)
            .count() as u64
    }
}

struct Run {
    table: InFlight,
    model: Model,
    caps: Caps,
    now_ms: u64,
    hwm: u64,
    handles: Vec<(Offset, u64)>,
    next_nonce: u64,
}

impl Run {
    fn handle(&self, pick: usize, forged: bool) -> (Offset, u64) {
        match self.handles.get(pick % self.handles.len().max(1)) {
            Some(&(offset, nonce)) if !forged => (offset, nonce),
            _ => (Offset(pick as u64 % HWM_MAX), u64::MAX - pick as u64 % 7),
        }
    }

    fn step(&mut self, op: &Op) {
        let settled_before = (self.model.frontier(), self.model.acked_ahead());
        let now_ms = self.now_ms;
        match *op {
            Op::Reserve { visibility_ms } => {
                let nonce = self.next_nonce;
                self.next_nonce += 1;
                let hwm = Offset(self.hwm);
                let got = self
                    .table
                    .reserve(now_ms, hwm, &self.caps, visibility_ms, nonce);
                let want = self
                    .model
                    .reserve(now_ms, self.hwm, &self.caps, visibility_ms, nonce);
                assert_eq!(got, want, "reserve");
                if let Reserve::Reserved { offset, .. } = got {
                    self.handles.push((offset, nonce));
                }
            }
            Op::Ack { pick, forged } => {
                let (offset, nonce) = self.handle(pick, forged);
                let got = self.table.ack(offset, nonce, now_ms);
                let want = self.model.handle(offset, nonce, now_ms, Slot::Settled);
                assert_eq!(got.is_ok(), want, "ack {offset}:{nonce}");
            }
            Op::Extend {
                pick,
                visibility_ms,
            } => {
                let (offset, nonce) = self.handle(pick, false);
                let got = self.table.extend(offset, nonce, now_ms, visibility_ms);
                let expiry_ms = now_ms + visibility_ms;
                let then = Slot::Leased { nonce, expiry_ms };
                let want = self.model.handle(offset, nonce, now_ms, then);
                assert_eq!(
                    got,
                    if want {
                        Ok(expiry_ms)
                    } else {
                        Err(HandleError::Stale)
                    }
                );
            }
            Op::Nack { pick } => {
                let (offset, nonce) = self.handle(pick, false);
                let got = self.table.nack(offset, nonce, now_ms);
                let want = self.model.handle(offset, nonce, now_ms, Slot::Free);
                assert_eq!(got.is_ok(), want, "nack {offset}:{nonce}");
            }
            Op::Advance { ms } => self.now_ms += ms,
            Op::Purge => {
                let before = self.model.leased().count();
                self.model.purge(now_ms);
                let want = before - self.model.leased().count();
                assert_eq!(self.table.purge_expired(now_ms), want, "purge");
            }
            Op::Grow { records } => self.hwm = (self.hwm + records).min(HWM_MAX),
            Op::Jump { to } => self.jump(Offset(to)),
            Op::Skip { start, len } => self.skip(start..start + len),
            Op::Crash { junk } => return self.crash(junk),
        }
        let changed = settled_before != (self.model.frontier(), self.model.acked_ahead());
        assert_eq!(
            self.table.take_settled_changed(),
            changed,
            "settled_changed"
        );
    }

    fn jump(&mut self, to: Offset) {
        let moved = to > self.model.frontier();
        for slot in &mut self.model.slots[..to.0 as usize] {
            *slot = Slot::Settled;
        }
        assert_eq!(self.table.jump_to(to), moved, "jump_to {to}");
    }

    fn skip(&mut self, range: Range<u64>) {
        let mut want = 0;
        for slot in &mut self.model.slots[range.start as usize..range.end as usize] {
            if *slot != Slot::Settled {
                *slot = Slot::Settled;
                want += 1;
            }
        }
        let got = self
            .table
            .skip_corrupt(Offset(range.start)..Offset(range.end));
        assert_eq!(got, want, "skip_corrupt {range:?}");
    }

    /// Rebuilds the table from the persisted pair only; the leases are forgotten.
    fn crash(&mut self, junk: bool) {
        for slot in &mut self.model.slots {
            if matches!(slot, Slot::Leased { .. }) {
                *slot = Slot::Free;
            }
        }
        let frontier = self.table.frontier();
        let mut persisted: Vec<Offset> = self.table.acked_ahead().collect();
        if junk && frontier.0 > 0 {
            persisted.push(Offset(frontier.0 - 1));
        }
        self.table = InFlight::new(frontier, persisted);
        assert_eq!(self.table.take_settled_changed(), junk && frontier.0 > 0);
    }

    fn compare(&self) {
        self.table.assert_invariants();
        let (t, m) = (&self.table, &self.model);
        assert_eq!(t.frontier(), m.frontier(), "frontier");
        assert_eq!(
            t.acked_ahead().collect::<Vec<_>>(),
            m.acked_ahead(),
            "acked ahead"
        );
        assert_eq!(t.acked_ahead_len(), m.acked_ahead().len());
        assert_eq!(t.in_flight(), m.leased().count(), "in flight");
        assert_eq!(
            t.next_expiry_ms(),
            m.leased().map(|(_, e)| e).min(),
            "next expiry"
        );
        for hwm in [self.hwm, HWM_MAX] {
            assert_eq!(
                t.available(Offset(hwm)),
                m.available(hwm),
                "available({hwm})"
            );
        }
        for &(offset, nonce) in &self.handles {
            let want = matches!(m.slots[offset.0 as usize],
                Slot::Leased { nonce: n, expiry_ms } if n == nonce && expiry_ms > self.now_ms);
            assert_eq!(t.is_leased(offset, nonce, self.now_ms), want, "is_leased");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn table_matches_the_model(
        in_flight_max in 0..8usize,
        acked_ahead_max in 0..8usize,
        hwm in 0..HWM_MAX,
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut run = Run {
            table: InFlight::new(Offset(0), []),
            model: Model { slots: vec![Slot::Free; OFFSETS as usize] },
            caps: Caps { in_flight_max, acked_ahead_max },
            now_ms: 0,
            hwm,
            handles: Vec::new(),
            next_nonce: 1,
        };
        for op in &ops {
            run.step(op);
            run.compare();
        }
    }
}
