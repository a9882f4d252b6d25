//! Naive stand-in for the in-flight table (replaced by the real one).
use crate::ids::Offset;
use std::collections::{BTreeMap, BTreeSet};

pub struct Caps {
    pub in_flight_max: usize,
    pub acked_ahead_max: usize,
}
pub enum Reserve {
    Reserved { offset: Offset, expiry_ms: u64 },
    Empty,
    Full,
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleError {
    Stale,
}
pub struct InFlight {
    frontier: u64,
    leases: BTreeMap<u64, (u64, u64)>,
    ahead: BTreeSet<u64>,
    changed: bool,
}
impl InFlight {
    pub fn new(frontier: Offset, acked_ahead: impl IntoIterator<Item = Offset>) -> Self {
        let mut t = InFlight {
            frontier: frontier.0,
            leases: BTreeMap::new(),
            ahead: acked_ahead
                .into_iter()
                .map(|o| o.0)
                .filter(|&o| o > frontier.0)
                .collect(),
            changed: false,
        };
        t.advance();
        t
    }
    fn advance(&mut self) {
        while self.ahead.remove(&self.frontier) {
            self.frontier += 1;
            self.changed = true;
        }
    }
    pub fn frontier(&self) -> Offset {
        Offset(self.frontier)
    }
    pub fn acked_ahead(&self) -> impl Iterator<Item = Offset> + '_ {
        self.ahead.iter().map(|&o| Offset(o))
    }
    pub fn acked_ahead_len(&self) -> usize {
        self.ahead.len()
    }
    pub fn in_flight(&self) -> usize {
        self.leases.len()
    }
    pub fn purge_expired(&mut self, now_ms: u64) -> usize {
        let n = self.leases.len();
        self.leases.retain(|_, (_, e)| *e > now_ms);
        n - self.leases.len()
    }
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.leases.values().map(|(_, e)| *e).min()
    }
    pub fn reserve(
        &mut self,
        now_ms: u64,
        hwm: Offset,
        caps: &Caps,
        visibility_ms: u64,
        nonce: u64,
    ) -> Reserve {
        self.purge_expired(now_ms);
        if self.leases.len() >= caps.in_flight_max {
            return Reserve::Full;
        }
        let mut o = self.frontier;
        while o < hwm.0 {
            if !self.leases.contains_key(&o) && !self.ahead.contains(&o) {
                if self.ahead.len() >= caps.acked_ahead_max && o != self.frontier {
                    return Reserve::Empty;
                }
                self.leases.insert(o, (nonce, now_ms + visibility_ms));
                return Reserve::Reserved {
                    offset: Offset(o),
                    expiry_ms: now_ms + visibility_ms,
                };
            }
            o += 1;
        }
        Reserve::Empty
    }
    fn live(&mut self, offset: Offset, nonce: u64, now_ms: u64) -> Result<(), HandleError> {
        match self.leases.get(&offset.0) {
            Some(&(n, e)) if n == nonce && e > now_ms => Ok(()),
            _ => Err(HandleError::Stale),
        }
    }
    pub fn ack(&mut self, offset: Offset, nonce: u64, now_ms: u64) -> Result<(), HandleError> {
        self.live(offset, nonce, now_ms)?;
        self.leases.remove(&offset.0);
        self.ahead.insert(offset.0);
        self.changed = true;
        self.advance();
        Ok(())
    }
    pub fn extend(
        &mut self,
        offset: Offset,
        nonce: u64,
        now_ms: u64,
        visibility_ms: u64,
    ) -> Result<u64, HandleError> {
        self.live(offset, nonce, now_ms)?;
        self.leases
            .insert(offset.0, (nonce, now_ms + visibility_ms));
        Ok(now_ms + visibility_ms)
    }
    pub fn nack(&mut self, offset: Offset, nonce: u64, now_ms: u64) -> Result<(), HandleError> {
        self.live(offset, nonce, now_ms)?;
        self.leases.remove(&offset.0);
        Ok(())
    }
    pub fn skip_corrupt(&mut self, range: std::ops::Range<Offset>) -> u64 {
        for o in range.start.0.max(self.frontier)..range.end.0 {
            self.leases.remove(&o);
            self.ahead.insert(o);
        }
        self.changed = true;
        self.advance();
        range.end.0 - range.start.0
    }
    pub fn jump_to(&mut self, oldest: Offset) -> bool {
        if oldest.0 <= self.frontier {
            return false;
        }
        self.frontier = oldest.0;
        self.leases.retain(|&o, _| o >= oldest.0);
        self.ahead.retain(|&o| o >= oldest.0);
        self.changed = true;
        self.advance();
        true
    }
    pub fn available(&self, hwm: Offset) -> u64 {
        hwm.0
            .saturating_sub(self.frontier)
            .saturating_sub((self.leases.len() + self.ahead.len()) as u64)
    }
    pub fn take_settled_changed(&mut self) -> bool {
        std::mem::replace(&mut self.changed, false)
    }
    pub fn is_leased(&self, offset: Offset, nonce: u64, now_ms: u64) -> bool {
        matches!(self.leases.get(&offset.0), Some(&(n, e)) if n == nonce && e > now_ms)
    }
}
