//! Event subscription masks and the mapping of `StateChange` notifications
//! onto plugin handlers.

use dra_cpu_proto::nri::api::Event;

/// The set of events a plugin subscribes to, as sent in `ConfigureResponse`:
/// event `e` is bit `1 << (e - 1)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EventMask(i32);

/// Every event a plugin can subscribe to, in protocol order.
pub const SUBSCRIBABLE_EVENTS: [Event; 14] = [
    Event::RUN_POD_SANDBOX,
    Event::STOP_POD_SANDBOX,
    Event::REMOVE_POD_SANDBOX,
    Event::CREATE_CONTAINER,
    Event::POST_CREATE_CONTAINER,
    Event::START_CONTAINER,
    Event::POST_START_CONTAINER,
    Event::UPDATE_CONTAINER,
    Event::POST_UPDATE_CONTAINER,
    Event::STOP_CONTAINER,
    Event::REMOVE_CONTAINER,
    Event::UPDATE_POD_SANDBOX,
    Event::POST_UPDATE_POD_SANDBOX,
    Event::VALIDATE_CONTAINER_ADJUSTMENT,
];

impl EventMask {
    /// No events.
    pub const EMPTY: EventMask = EventMask(0);

    /// The mask holding exactly `events`.
    pub fn of(events: &[Event]) -> Self {
        events.iter().fold(Self::EMPTY, |mask, e| mask.with(*e))
    }

    /// The bit of one event; `None` for `UNKNOWN` and `LAST`, which are not
    /// events.
    pub fn bit(event: Event) -> Option<i32> {
        let value = event as i32;
        if value <= 0 || value >= Event::LAST as i32 {
            return None;
        }
        Some(1 << (value - 1))
    }

    /// This mask plus `event` (unchanged for non-events).
    pub fn with(self, event: Event) -> Self {
        match Self::bit(event) {
            Some(bit) => EventMask(self.0 | bit),
            None => self,
        }
    }

    pub fn contains(self, event: Event) -> bool {
        Self::bit(event).is_some_and(|bit| self.0 & bit != 0)
    }

    /// The wire value for `ConfigureResponse.events`.
    pub fn bits(self) -> i32 {
        self.0
    }

    /// A mask from its wire value; bits that name no event are dropped.
    pub fn from_bits(bits: i32) -> Self {
        SUBSCRIBABLE_EVENTS
            .iter()
            .filter(|e| Self::bit(**e).is_some_and(|b| bits & b != 0))
            .fold(Self::EMPTY, |m, e| m.with(*e))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The events in this mask, in protocol order.
    pub fn events(self) -> Vec<Event> {
        SUBSCRIBABLE_EVENTS
            .iter()
            .copied()
            .filter(|e| self.contains(*e))
            .collect()
    }
}

impl std::fmt::Display for EventMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.events().iter().map(|e| format!("{e:?}")).collect();
        write!(f, "{} (0x{:x})", names.join(","), self.0)
    }
}

/// The handler a `StateChange` notification is delivered to.
///
/// Runtimes with NRI 0.6 deliver every event without a reply payload as
/// `StateChange`; newer ones call the dedicated RPC first and fall back to
/// `StateChange` when the plugin answers `UNIMPLEMENTED`. Both paths end in
/// the same plugin method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateChangeTarget {
    RunPodSandbox,
    StopPodSandbox,
    RemovePodSandbox,
    PostUpdatePodSandbox,
    PostCreateContainer,
    StartContainer,
    PostStartContainer,
    PostUpdateContainer,
    RemoveContainer,
}

/// Where a `StateChange` with event number `event` goes. `None` for events
/// that carry a reply (create/update/stop container, update pod sandbox,
/// validation) and so can never be a plain notification, and for numbers
/// this protocol version does not know; those are acknowledged and ignored,
/// as the reference plugin stub does.
pub fn state_change_target(event: i32) -> Option<StateChangeTarget> {
    use StateChangeTarget as T;
    let event = <Event as protobuf::Enum>::from_i32(event)?;
    Some(match event {
        Event::RUN_POD_SANDBOX => T::RunPodSandbox,
        Event::STOP_POD_SANDBOX => T::StopPodSandbox,
        Event::REMOVE_POD_SANDBOX => T::RemovePodSandbox,
        Event::POST_UPDATE_POD_SANDBOX => T::PostUpdatePodSandbox,
        Event::POST_CREATE_CONTAINER => T::PostCreateContainer,
        Event::START_CONTAINER => T::StartContainer,
        Event::POST_START_CONTAINER => T::PostStartContainer,
        Event::POST_UPDATE_CONTAINER => T::PostUpdateContainer,
        Event::REMOVE_CONTAINER => T::RemoveContainer,
        Event::UNKNOWN
        | Event::CREATE_CONTAINER
        | Event::UPDATE_CONTAINER
        | Event::STOP_CONTAINER
        | Event::UPDATE_POD_SANDBOX
        | Event::VALIDATE_CONTAINER_ADJUSTMENT
        | Event::LAST => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bits_follow_the_protocol_numbering() {
        let cases = [
            (Event::RUN_POD_SANDBOX, Some(0x1)),
            (Event::CREATE_CONTAINER, Some(0x8)),
            (Event::STOP_CONTAINER, Some(0x200)),
            (Event::REMOVE_CONTAINER, Some(0x400)),
            (Event::VALIDATE_CONTAINER_ADJUSTMENT, Some(0x2000)),
            (Event::UNKNOWN, None),
            (Event::LAST, None),
        ];
        for (event, bit) in cases {
            assert_eq!(EventMask::bit(event), bit, "{event:?}");
        }
    }

    #[test]
    fn mask_table() {
        let cases: [(&[Event], i32); 4] = [
            (&[], 0),
            (
                &[
                    Event::CREATE_CONTAINER,
                    Event::STOP_CONTAINER,
                    Event::REMOVE_CONTAINER,
                ],
                0x608,
            ),
            (&[Event::CREATE_CONTAINER, Event::CREATE_CONTAINER], 0x8),
            (&[Event::UNKNOWN, Event::LAST, Event::RUN_POD_SANDBOX], 0x1),
        ];
        for (events, bits) in cases {
            assert_eq!(EventMask::of(events).bits(), bits, "{events:?}");
        }
    }

    #[test]
    fn display_names_events_and_bits() {
        let mask = EventMask::of(&[Event::CREATE_CONTAINER, Event::REMOVE_CONTAINER]);
        assert_eq!(
            mask.to_string(),
            "CREATE_CONTAINER,REMOVE_CONTAINER (0x408)"
        );
    }

    #[test]
    fn state_change_table() {
        use StateChangeTarget as T;
        let cases = [
            (1, Some(T::RunPodSandbox)),
            (2, Some(T::StopPodSandbox)),
            (3, Some(T::RemovePodSandbox)),
            (4, None),
            (5, Some(T::PostCreateContainer)),
            (6, Some(T::StartContainer)),
            (7, Some(T::PostStartContainer)),
            (8, None),
            (9, Some(T::PostUpdateContainer)),
            (10, None),
            (11, Some(T::RemoveContainer)),
            (12, None),
            (13, Some(T::PostUpdatePodSandbox)),
            (14, None),
            (0, None),
            (15, None),
            (99, None),
            (-1, None),
        ];
        for (event, target) in cases {
            assert_eq!(state_change_target(event), target, "event {event}");
        }
    }

    proptest! {
        #[test]
        fn from_bits_round_trips_subscribable_sets(selection in proptest::collection::vec(any::<bool>(), 14)) {
            let events: Vec<Event> = SUBSCRIBABLE_EVENTS.iter().zip(&selection).filter(|(_, s)| **s).map(|(e, _)| *e).collect();
            let mask = EventMask::of(&events);
            prop_assert_eq!(EventMask::from_bits(mask.bits()), mask);
            prop_assert_eq!(mask.events(), events);
        }

        #[test]
        fn from_bits_drops_unknown_bits(bits in any::<i32>()) {
            let mask = EventMask::from_bits(bits);
            prop_assert_eq!(mask.bits() & !0x3fff, 0);
            prop_assert_eq!(mask.bits(), bits & 0x3fff);
        }
    }
}
