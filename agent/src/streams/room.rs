//! How many streams one user may hold: the agent's one fairness rule
//! (admission::fits) over the stream table's cap.

use crate::admission;

/// Whether one more stream fits for a user holding `mine` of the `held`:
/// at most `max_held` in all, and one user's at most half of what the other
/// users leave (admission::fits), so that no user, nor two together, can
/// take every slot (and with it every other user's write-behind).  The
/// first stream always fits, so that `--max-streams 1` still holds one.
pub(super) fn room(held: usize, mine: usize, max_held: usize) -> Result<(), &'static str> {
    if held >= max_held {
        return Err("too many streams");
    }
    if held > 0 && !admission::fits(mine, held - mine, 1, max_held) {
        return Err("one user holds its share of the streams");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streams::MAX_HELD;

    /// Streams started one after another, each by the first user of `users`
    /// it fits for: how many each got.
    fn fill(users: usize, max_held: usize) -> Vec<usize> {
        let mut held = vec![0; users];
        while let Some(u) = (0..users).find(|&u| room(held.iter().sum(), held[u], max_held).is_ok()) {
            held[u] += 1;
        }
        held
    }

    #[test]
    fn one_user_gets_half_of_what_the_others_leave_of_the_streams() {
        assert_eq!(fill(1, MAX_HELD), vec![MAX_HELD / 2], "a user alone: half");
        assert_eq!(fill(2, MAX_HELD), vec![MAX_HELD / 2, MAX_HELD / 4], "a second: a quarter");
        // --max-streams 8 (hardening's): 4, 2, 1, and the last slot for nobody.
        assert_eq!(fill(5, 8), vec![4, 2, 1, 0, 0]);
        assert_eq!(room(7, 0, 8), Err("one user holds its share of the streams"));
        assert_eq!(room(8, 0, 8), Err("too many streams"));
        assert_eq!(fill(2, 1), vec![1, 0], "a cap of one: the first stream still fits");
        assert_eq!(fill(2, 2), vec![1, 0]);
        assert_eq!(fill(2, 0), vec![0, 0]);
        // room_for counts a user's streams only where a user holding all of
        // them would not fit: one that fits with more fits with fewer.
        assert!(room(MAX_HELD / 2 - 1, MAX_HELD / 2 - 1, MAX_HELD).is_ok());
        assert!(room(MAX_HELD / 2, MAX_HELD / 2, MAX_HELD).is_err());
        for held in 0..=20 {
            for mine in 1..=held {
                assert!(room(held, mine, 20).is_err() || room(held, mine - 1, 20).is_ok(), "{held} held, {mine} mine");
            }
        }
    }
}
