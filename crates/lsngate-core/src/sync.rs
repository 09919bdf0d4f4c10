//! The one lock helper: the library and the proxy keep core's pure state (replay books, the
//! primary guard) behind `std::sync::Mutex`es that are held for a few arithmetic steps, never
//! across an await. Not a lock type of its own, and nothing here blocks on I/O.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, taking over a poisoned one: poisoning only means another thread panicked
/// mid-update of plain numbers and maps whose every state is valid, so the data is still usable
/// and a panic elsewhere must not take routing down with it.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let mutex = std::sync::Arc::new(Mutex::new(1));
        let poisoner = std::sync::Arc::clone(&mutex);
        let _ = std::thread::spawn(move || {
            let _guard = poisoner.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(mutex.is_poisoned());
        *lock(&mutex) += 1;
        assert_eq!(*lock(&mutex), 2);
    }
}
