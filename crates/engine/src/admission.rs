//! Admission: how many runs at once, globally and per caller, and which uid slot each holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Counts runs in flight. Over a limit, a run is refused at once (`capacity`), never queued.
#[derive(Debug)]
pub struct Admission {
    max_total: usize,
    max_per_caller: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// `slots[i]` is true while a run holds uid slot `i`.
    slots: Vec<bool>,
    per_caller: HashMap<String, usize>,
}

/// A run's place: released when dropped.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    caller: String,
    slot: usize,
}

impl Permit {
    /// The uid slot this run holds, `0..max_total`.
    pub fn slot(&self) -> usize {
        self.slot
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut st = self
            .admission
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        st.slots[self.slot] = false;
        if let Some(n) = st.per_caller.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                st.per_caller.remove(&self.caller);
            }
        }
    }
}

impl Admission {
    /// Limits: runs at once in total, and per caller.
    pub fn new(max_total: usize, max_per_caller: usize) -> Arc<Self> {
        Arc::new(Admission {
            max_total,
            max_per_caller,
            state: Mutex::new(State {
                slots: vec![false; max_total],
                per_caller: HashMap::new(),
            }),
        })
    }

    /// Takes a place for `caller`, or says which limit is full.
    pub fn try_admit(self: &Arc<Self>, caller: &str) -> Result<Permit, String> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mine = st.per_caller.get(caller).copied().unwrap_or(0);
        if mine >= self.max_per_caller {
            return Err(format!(
                "caller `{caller}` already has {mine} runs in flight (limit {}): retry when one ends",
                self.max_per_caller
            ));
        }
        let Some(slot) = st.slots.iter().position(|busy| !busy) else {
            return Err(format!(
                "the server is running its limit of {} runs at once: retry shortly",
                self.max_total
            ));
        };
        st.slots[slot] = true;
        *st.per_caller.entry(caller.to_owned()).or_insert(0) += 1;
        Ok(Permit {
            admission: Arc::clone(self),
            caller: caller.to_owned(),
            slot,
        })
    }

    /// Runs in flight now.
    pub fn in_flight(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.slots.iter().filter(|b| **b).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_hold_and_release() {
        let a = Admission::new(2, 1);
        let p1 = a.try_admit("alice").unwrap();
        assert!(a.try_admit("alice").unwrap_err().contains("alice"));
        let p2 = a.try_admit("bob").unwrap();
        assert_ne!(p1.slot(), p2.slot());
        assert!(a.try_admit("carol").unwrap_err().contains("limit of 2"));
        drop(p1);
        let p3 = a.try_admit("carol").unwrap();
        assert_eq!(a.in_flight(), 2);
        drop((p2, p3));
        assert_eq!(a.in_flight(), 0);
    }
}
