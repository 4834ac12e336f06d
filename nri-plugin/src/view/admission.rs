//! Admission: the two view operations that may have to ask about a claim
//! the view has not heard of. The asking (a [`ClaimResolver`]) is slow, so
//! it runs outside the view's lock, which is taken only to decide.

use std::sync::Mutex;

use shared_state::pool::PoolError;
use shared_state::{ClaimAssignment, CpuSet};

use super::claims::ClaimOrigin;
use super::planning::{CreateDecision, CreateOutcome};
use super::refusal::Refusal;
use super::synchronize::{pods_to_ask_for, unknown_claims, SyncOutcome};
use super::{ContainerInfo, NodeView};
use crate::resolve::{ClaimResolver, Resolution, RESERVED_FOR_ASK_BEFORE};
use std::time::Instant;

fn lock(view: &Mutex<NodeView>) -> std::sync::MutexGuard<'_, NodeView> {
    // The view is plain data; a panic elsewhere cannot leave it half-written
    // in a way that is worse than refusing to serve.
    shared_state::sync::lock(view)
}

/// A claim from a CDI spec as the view stores it (no consumer yet).
pub fn cdi_claim(claim_uid: &str, cpus: CpuSet) -> ClaimAssignment {
    ClaimAssignment {
        claim_uid: claim_uid.to_string(),
        namespace: String::new(),
        name: String::new(),
        consumer_pods: Vec::new(),
        devices: Vec::new(),
        cpus,
        prepared_at_unix_ms: 0,
        pod_claim_name: None,
        tuning: Default::default(),
    }
}

/// Teach the view about one claim through the resolver.
async fn resolve_into<R: ClaimResolver + ?Sized>(
    view: &Mutex<NodeView>,
    resolver: &R,
    claim_uid: &str,
) -> Result<(), ResolveFailure> {
    learn_resolution(view, claim_uid, resolver.resolve(claim_uid).await)
}

fn learn_resolution(
    view: &Mutex<NodeView>,
    claim_uid: &str,
    resolution: Resolution,
) -> Result<(), ResolveFailure> {
    match resolution {
        Resolution::Prepared { claim, revision } => {
            let mut view = lock(view);
            if is_behind(&view, revision) {
                return known_to(&view, claim_uid);
            }
            view.learn_claim(claim, ClaimOrigin::DraPlugin)
                .map(|_| ())
                .map_err(ResolveFailure::Pool)
        }
        Resolution::FromCdi(cpus) => {
            let mut view = lock(view);
            // dra-plugin's event came while its answer did not: the record
            // it sent stands, and the spec does not make it provisional.
            if known_to(&view, claim_uid).is_ok() {
                return Ok(());
            }
            view.learn_claim(cdi_claim(claim_uid, cpus), ClaimOrigin::CdiSpec)
                .map(|_| ())
                .map_err(ResolveFailure::Cdi)
        }
        Resolution::NotPrepared { revision } => {
            let view = lock(view);
            if is_behind(&view, revision) {
                return known_to(&view, claim_uid);
            }
            Err(ResolveFailure::NotPrepared)
        }
        Resolution::Unverifiable(reason) => Err(ResolveFailure::Unverifiable(reason)),
    }
}

/// Whether an answer of dra-plugin at store revision `revision` is no newer
/// than what the view has applied from its events: the answer was read
/// before an event the view has had since (an unprepare, or the prepare the
/// asking container waited for), so the view, not the answer, is right.
/// While the view does not follow dra-plugin's stream no event can overtake
/// an answer, and the answer decides.
fn is_behind(view: &NodeView, revision: u64) -> bool {
    view.follows_dra_plugin() && revision <= view.revision()
}

/// The view's own word on a claim: prepared when dra-plugin's events put
/// it there (a claim known from its CDI spec alone is not).
fn known_to(view: &NodeView, claim_uid: &str) -> Result<(), ResolveFailure> {
    if view.pool().claim(claim_uid).is_some() && !view.is_provisional(claim_uid) {
        Ok(())
    } else {
        Err(ResolveFailure::NotPrepared)
    }
}

/// dra-plugin's answer about claim `uid`, asked for `pod` (a pod the
/// view's record does not name): learned when it names the pod as a
/// consumer. `None`: it does not (or dra-plugin could not be asked), and the
/// record stands.
fn learn_for_pod(
    view: &Mutex<NodeView>,
    uid: &str,
    pod: &str,
    answer: Resolution,
) -> Option<Result<(), ResolveFailure>> {
    match answer {
        Resolution::Prepared { claim, revision }
            if claim.consumer_pods.iter().any(|p| p == pod) =>
        {
            Some(learn_resolution(
                view,
                uid,
                Resolution::Prepared { claim, revision },
            ))
        }
        Resolution::Unverifiable(reason) => {
            tracing::warn!(claim = %uid, pod_uid = %pod, %reason, "could not ask dra-plugin whether the claim is reserved for this pod now");
            None
        }
        _ => None,
    }
}

enum ResolveFailure {
    NotPrepared,
    Unverifiable(String),
    Pool(PoolError),
    Cdi(PoolError),
}

/// CreateContainer: decide, resolving unknown claims through `resolver`
/// (each claim at most once). A claim known only from its CDI spec is
/// asked about first: dra-plugin's answer has what the spec lacks, the
/// claim's pods and its tuning (no CFS quota, an isolated partition), which
/// the container must get from its creation on. If dra-plugin does not
/// answer, the spec's CPUs stand. The returned updates are not marked
/// applied.
pub async fn admit_container<R: ClaimResolver + ?Sized>(
    view: &Mutex<NodeView>,
    info: &ContainerInfo,
    resolver: &R,
) -> Result<CreateDecision, Refusal> {
    let started = Instant::now();
    let provisional: Vec<String> = {
        let view = lock(view);
        NodeView::env_claims(info)
            .map(|refs| {
                refs.into_iter()
                    .map(|r| r.claim_uid)
                    .filter(|uid| view.is_provisional(uid))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut asked: Vec<String> = Vec::new();
    // Concurrently, as at Synchronize: each answer is bounded, and so is
    // their sum only if they do not queue behind each other (the reply
    // must stay far inside NRI's 2 s).
    let answers =
        futures::future::join_all(provisional.iter().map(|uid| resolver.resolve(uid))).await;
    for (uid, answer) in provisional.into_iter().zip(answers) {
        let learned = match answer {
            answer @ (Resolution::Prepared { .. } | Resolution::NotPrepared { .. }) => {
                learn_resolution(view, &uid, answer)
            }
            // Nothing new: the claim stays as its spec (and the pod that
            // adopted it) made it.
            Resolution::FromCdi(_) | Resolution::Unverifiable(_) => Ok(()),
        };
        if let Err(failure) = learned {
            return Err(failure.refusal(info, uid));
        }
        asked.push(uid);
    }
    // Claims asked about again for this pod, each at most once, and only
    // while the answer still fits in the runtime's wait.
    let mut asked_for_pod: Vec<String> = Vec::new();
    loop {
        let outcome = lock(view).create(info);
        let uid = match outcome {
            CreateOutcome::Decided(decision) => return Ok(decision),
            CreateOutcome::Refused(refusal) => {
                // Kubelet prepares a claim once per node: a pod that shares
                // it and came later is not in dra-plugin's first record,
                // and dra-plugin is asked whether the claim's reservedFor
                // names it now. A provisional claim's dra-plugin did not
                // answer a moment ago; its adoption rule stands.
                let Some(uid) = refusal.wrong_pod_claim().map(str::to_string) else {
                    return Err(refusal);
                };
                if asked_for_pod.contains(&uid)
                    || lock(view).is_provisional(&uid)
                    || started.elapsed() >= RESERVED_FOR_ASK_BEFORE
                {
                    return Err(refusal);
                }
                asked_for_pod.push(uid.clone());
                let answer = resolver.resolve_for_pod(&uid, &info.pod_uid).await;
                match learn_for_pod(view, &uid, &info.pod_uid, answer) {
                    Some(Ok(())) => continue,
                    Some(Err(failure)) => return Err(failure.refusal(info, uid)),
                    None => return Err(refusal),
                }
            }
            CreateOutcome::UnknownClaim(uid) => uid,
        };
        if asked.contains(&uid) {
            // Resolved but gone again (unprepared meanwhile).
            return Err(Refusal::NotPrepared {
                container: info.id.clone(),
                name: info.name.clone(),
                pod_uid: info.pod_uid.clone(),
                claim_uid: uid,
            });
        }
        if let Err(failure) = resolve_into(view, resolver, &uid).await {
            return Err(failure.refusal(info, uid));
        }
        asked.push(uid);
    }
}

impl ResolveFailure {
    /// The refusal of `info`'s creation when its claim `claim_uid` could
    /// not be learned.
    fn refusal(self, info: &ContainerInfo, claim_uid: String) -> Refusal {
        let (container, name, pod_uid) = (info.id.clone(), info.name.clone(), info.pod_uid.clone());
        match self {
            ResolveFailure::NotPrepared => Refusal::NotPrepared {
                container,
                name,
                pod_uid,
                claim_uid,
            },
            ResolveFailure::Unverifiable(reason) => Refusal::Unverifiable {
                container,
                name,
                pod_uid,
                claim_uid,
                reason,
            },
            ResolveFailure::Pool(source) => Refusal::Pool {
                name,
                pod_uid,
                source,
            },
            ResolveFailure::Cdi(source) => Refusal::BadCdiClaim {
                container,
                name,
                pod_uid,
                claim_uid,
                source,
            },
        }
    }
}

/// Synchronize: resolve the claims running containers name, then rebuild.
pub async fn synchronize_containers<R: ClaimResolver + ?Sized>(
    view: &Mutex<NodeView>,
    containers: &[ContainerInfo],
    resolver: &R,
) -> SyncOutcome {
    let unknown = unknown_claims(&lock(view), containers);
    // Concurrently: each resolution is bounded, and so is their sum only if
    // they do not queue behind each other.
    let answers = futures::future::join_all(unknown.iter().map(|uid| resolver.resolve(uid))).await;
    for (uid, answer) in unknown.iter().zip(answers) {
        let provisional = lock(view).is_provisional(uid);
        if learn_resolution(view, uid, answer).is_err() && !provisional {
            tracing::warn!(claim = %uid, "claim of a running container could not be resolved");
        }
    }
    // A running container of a pod its claim's record does not name was
    // created while no creation could ask (nri-plugin away): asked now, as
    // a creation would, before it is placed.
    let pairs = pods_to_ask_for(&lock(view), containers);
    let answers = futures::future::join_all(
        pairs
            .iter()
            .map(|(uid, pod)| resolver.resolve_for_pod(uid, pod)),
    )
    .await;
    for ((uid, pod), answer) in pairs.iter().zip(answers) {
        if let Some(Err(_)) = learn_for_pod(view, uid, pod, answer) {
            tracing::warn!(claim = %uid, pod_uid = %pod, "the claim's record naming the pod could not be applied");
        }
    }
    lock(view).synchronize(containers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::*;
    use shared_state::pool::Update;
    use shared_state::NodeSnapshot;
    use std::collections::HashMap;

    /// An event of dra-plugin's stream reaches the view while a Lookup is
    /// on its way; the answer read before it is then `answer`.
    struct EventDuringLookup<'a> {
        view: &'a Mutex<NodeView>,
        event: (u64, Option<ClaimAssignment>),
        answer: Resolution,
    }

    #[async_trait::async_trait]
    impl ClaimResolver for EventDuringLookup<'_> {
        async fn resolve(&self, claim_uid: &str) -> Resolution {
            let (revision, prepared) = self.event.clone();
            let mut view = lock(self.view);
            match prepared {
                Some(claim) => view.apply_prepared(revision, claim).map(|_| ()),
                None => view.apply_unprepared(revision, claim_uid).map(|_| ()),
            }
            .expect("the event applies");
            self.answer.clone()
        }
    }

    /// What the view has when it admits: (what, the event, the answer,
    /// admitted cpuset or refusal, whether the view knows the claim after).
    type Case = (
        &'static str,
        (u64, Option<ClaimAssignment>),
        Resolution,
        Result<&'static str, &'static str>,
        bool,
    );

    /// An answer read before an event the view has applied since is older
    /// than the view: an unprepare it has seen does not come back as a
    /// prepared claim, and a prepare it has seen is not undone by a "not
    /// prepared". The view stands at revision 5 before the Lookup.
    #[test]
    fn an_answer_older_than_the_view_does_not_overrule_it() {
        let info = container("x", POD_A, &[&env(CLAIM_2, "5")], None);
        let answer = |revision| Resolution::Prepared {
            claim: claim(CLAIM_2, "5", POD_A),
            revision,
        };
        let cases: Vec<Case> = vec![
            (
                "unprepared at 6, answer read at 5",
                (6, None),
                answer(5),
                Err("claim-not-prepared"),
                false,
            ),
            (
                "unprepared at 6, answer read at 6",
                (6, None),
                answer(6),
                Err("claim-not-prepared"),
                false,
            ),
            (
                "unprepared at 6, prepared again at 7",
                (6, None),
                answer(7),
                Ok("5"),
                true,
            ),
            (
                "prepared at 6, answer 'not prepared' read at 5",
                (6, Some(claim(CLAIM_2, "5", POD_A))),
                Resolution::NotPrepared { revision: 5 },
                Ok("5"),
                true,
            ),
            (
                "prepared at 6, dra-plugin's answer lost, the CDI spec read",
                (6, Some(claim(CLAIM_2, "5", POD_A))),
                Resolution::FromCdi(set("5")),
                Ok("5"),
                true,
            ),
            (
                "prepared at 6, unprepared at 7",
                (6, Some(claim(CLAIM_2, "5", POD_A))),
                Resolution::NotPrepared { revision: 7 },
                Err("claim-not-prepared"),
                // Until the unprepare's event reaches the view.
                true,
            ),
        ];
        for (what, event, answer, want, known_after) in cases {
            let v = view_at(5);
            let view = Mutex::new(v);
            let resolver = EventDuringLookup {
                view: &view,
                event,
                answer,
            };
            let got = run(admit_container(&view, &info, &resolver));
            match (&got, want) {
                (Ok(d), Ok(cpus)) => assert_eq!(d.cpuset, set(cpus), "{what}"),
                (Err(r), Err(reason)) => assert_eq!(r.reason(), reason, "{what}: {r}"),
                _ => panic!("{what}: got {got:?}, want {want:?}"),
            }
            let known = lock(&view).pool().claim(CLAIM_2).is_some();
            assert_eq!(known, known_after, "{what}: the view knows the claim");
            assert!(
                !lock(&view).is_provisional(CLAIM_2),
                "{what}: dra-plugin's record is not replaced by its CDI spec"
            );
        }
    }

    /// dra-plugin started again on a new store counts its revisions from
    /// one: while the view does not follow its stream (until the next
    /// snapshot) its answers decide, whatever their revision.
    #[test]
    fn an_answer_decides_while_the_view_does_not_follow_dra_plugin() {
        let info = container("x", POD_A, &[&env(CLAIM_2, "5")], None);
        for following in [true, false] {
            let mut v = view_at(500);
            if !following {
                v.stop_following();
            }
            let view = Mutex::new(v);
            let resolver = TableResolver {
                answers: HashMap::from([(
                    CLAIM_2.to_string(),
                    Resolution::Prepared {
                        claim: claim(CLAIM_2, "5", POD_A),
                        revision: 3,
                    },
                )]),
                ..Default::default()
            };
            let got = run(admit_container(&view, &info, &resolver));
            match (following, &got) {
                (true, Err(r)) => assert_eq!(r.reason(), "claim-not-prepared", "{r}"),
                (false, Ok(d)) => assert_eq!(d.cpuset, set("5")),
                _ => panic!("following {following}: {got:?}"),
            }
        }
    }

    /// A view that knows CLAIM_2 (CPUs 6-7) from its CDI spec alone, as a
    /// restarted nri-plugin does, and a resolver giving `answer` for it.
    fn spec_only_view(answer: Resolution) -> (Mutex<NodeView>, TableResolver) {
        let mut v = view(false);
        v.learn_claim(cdi_claim(CLAIM_2, set("6-7")), ClaimOrigin::CdiSpec)
            .expect("from the spec");
        let resolver = TableResolver {
            answers: HashMap::from([(CLAIM_2.to_string(), answer)]),
            ..Default::default()
        };
        (Mutex::new(v), resolver)
    }

    /// A claim shared by name: kubelet prepared it for POD_A only, and POD_B
    /// was added to its reservedFor later. dra-plugin is asked once, for
    /// this pod; only an answer naming the pod admits it.
    #[test]
    fn a_pod_the_record_does_not_name_is_asked_about_once() {
        let info = container("x", POD_B, &[&env(CLAIM_1, "2")], None);
        let mut both = claim(CLAIM_1, "2", POD_A);
        both.consumer_pods.push(POD_B.to_string());
        // (answer asked for POD_B, expected cpuset or refusal reason)
        let cases: Vec<(Option<Resolution>, Result<&str, &str>)> = vec![
            (Some(prepared(both)), Ok("2")),
            (Some(prepared(claim(CLAIM_1, "2", POD_A))), Err("wrong-pod")),
            (Some(not_prepared()), Err("wrong-pod")),
            (
                Some(Resolution::Unverifiable("down".into())),
                Err("wrong-pod"),
            ),
            (None, Err("wrong-pod")),
        ];
        for (answer, want) in cases {
            let mut v = view(false);
            v.apply_prepared(1, claim(CLAIM_1, "2", POD_A))
                .expect("claim 1");
            let view = Mutex::new(v);
            let resolver = TableResolver {
                for_pod: answer
                    .clone()
                    .map(|a| HashMap::from([(CLAIM_1.to_string(), a)]))
                    .unwrap_or_default(),
                ..Default::default()
            };
            let got = run(admit_container(&view, &info, &resolver));
            match (&got, want) {
                (Ok(d), Ok(cpus)) => assert_eq!(d.cpuset, set(cpus), "{answer:?}"),
                (Err(r), Err(reason)) => assert_eq!(r.reason(), reason, "{answer:?}: {r}"),
                _ => panic!("{answer:?}: got {got:?}, want {want:?}"),
            }
            assert_eq!(
                *lock_calls(&resolver.calls),
                vec![format!("{CLAIM_1} for {POD_B}")],
                "{answer:?}"
            );
        }
    }

    /// A claim known from its CDI spec alone was adopted by the first pod
    /// that named it; dra-plugin did not answer a moment ago, so another
    /// pod is refused without asking for it.
    #[test]
    fn a_provisional_claim_is_not_asked_about_for_another_pod() {
        let (view, resolver) = spec_only_view(Resolution::FromCdi(set("6-7")));
        let first = container("a", POD_A, &[&env(CLAIM_2, "6-7")], None);
        run(admit_container(&view, &first, &resolver)).expect("POD_A adopts the claim");
        let refused = run(admit_container(
            &view,
            &container("b", POD_B, &[&env(CLAIM_2, "6-7")], None),
            &resolver,
        ))
        .expect_err("POD_B refused");
        assert_eq!(refused.reason(), "wrong-pod", "{refused}");
        assert!(
            !lock_calls(&resolver.calls)
                .iter()
                .any(|c| c.contains(" for ")),
            "{:?}",
            lock_calls(&resolver.calls)
        );
    }

    #[test]
    fn resolution_paths_table() {
        let info = container("x", POD_A, &[&env(CLAIM_2, "5")], None);
        // (answer, expected Ok cpuset or refusal reason, claim is provisional)
        let cases: Vec<(Resolution, Result<&str, &str>, bool)> = vec![
            (prepared(claim(CLAIM_2, "5", POD_A)), Ok("5"), false),
            (
                prepared(claim(CLAIM_2, "5", POD_B)),
                Err("wrong-pod"),
                false,
            ),
            (
                prepared(claim(CLAIM_2, "6", POD_A)),
                Err("cpus-mismatch"),
                false,
            ),
            (not_prepared(), Err("claim-not-prepared"), false),
            (Resolution::FromCdi(set("5")), Ok("5"), true),
            (Resolution::FromCdi(set("4")), Err("cpus-mismatch"), true),
            (Resolution::FromCdi(set("2")), Err("bad-cdi-claim"), false),
            (
                Resolution::Unverifiable("dra-plugin down, no spec".into()),
                Err("claim-unverifiable"),
                false,
            ),
        ];
        for (answer, want, provisional) in cases {
            let mut v = view(false);
            v.apply_prepared(1, claim(CLAIM_1, "2", POD_B))
                .expect("claim 1");
            let view = Mutex::new(v);
            let resolver = TableResolver {
                answers: HashMap::from([(CLAIM_2.to_string(), answer.clone())]),
                ..Default::default()
            };
            let got = run(admit_container(&view, &info, &resolver));
            match (&got, want) {
                (Ok(d), Ok(cpus)) => assert_eq!(d.cpuset, set(cpus), "{answer:?}"),
                (Err(r), Err(reason)) => {
                    assert_eq!(r.reason(), reason, "{answer:?}: {r}");
                    assert!(r.to_string().contains(CLAIM_2), "{r}");
                }
                _ => panic!("{answer:?}: got {got:?}, want {want:?}"),
            }
            let calls = lock_calls(&resolver.calls).clone();
            let (for_pod, plain): (Vec<_>, Vec<_>) =
                calls.iter().partition(|c| c.contains(" for "));
            assert_eq!(plain.len(), 1, "asked once: {calls:?}");
            // A record naming another pod is asked about again for this one.
            let wrong_pod = matches!(want, Err("wrong-pod")) && !provisional;
            assert_eq!(for_pod.len(), usize::from(wrong_pod), "{calls:?}");
            assert_eq!(
                lock(&view).is_provisional(CLAIM_2),
                provisional,
                "{answer:?}"
            );
        }
    }

    #[test]
    fn provisional_claim_serves_one_pod_and_a_snapshot_replaces_it() {
        let view = Mutex::new(view(false));
        let resolver = TableResolver {
            answers: HashMap::from([(CLAIM_2.to_string(), Resolution::FromCdi(set("5")))]),
            ..Default::default()
        };
        let first = container("a", POD_A, &[&env(CLAIM_2, "5")], None);
        run(admit_container(&view, &first, &resolver)).expect("first pod adopts");
        let other = container("b", POD_B, &[&env(CLAIM_2, "5")], None);
        let r = run(admit_container(&view, &other, &resolver)).expect_err("second pod");
        assert_eq!(r.reason(), "wrong-pod");
        let up = lock(&view)
            .apply_snapshot(NodeSnapshot {
                revision: 3,
                allocatable: set("1-7"),
                reserved: set("0"),
                mixed_allocation_mode: false,
                claims: vec![],
            })
            .expect("snapshot");
        // dra-plugin does not know the claim: its CPUs return to the pool.
        assert_eq!(up, updates(&[("a", "1-7")]));
        assert!(!lock(&view).is_provisional(CLAIM_2));
    }

    /// A container refused on a provisional claim (it names other CPUs)
    /// does not make its pod the claim's consumer: the claim's own pod is
    /// admitted after it. Control: a container admitted does adopt it.
    #[test]
    fn a_refused_container_does_not_adopt_a_provisional_claim() {
        let view = Mutex::new(view(false));
        let resolver = TableResolver {
            answers: HashMap::from([(CLAIM_2.to_string(), Resolution::FromCdi(set("5")))]),
            ..Default::default()
        };
        let wrong_cpus = container("b", POD_B, &[&env(CLAIM_2, "4")], None);
        let r = run(admit_container(&view, &wrong_cpus, &resolver)).expect_err("other CPUs");
        assert_eq!(r.reason(), "cpus-mismatch", "{r}");
        let owner = container("a", POD_A, &[&env(CLAIM_2, "5")], None);
        run(admit_container(&view, &owner, &resolver)).expect("the claim's pod");
        let again = container("b2", POD_B, &[&env(CLAIM_2, "5")], None);
        let r = run(admit_container(&view, &again, &resolver)).expect_err("adopted by POD_A");
        assert_eq!(r.reason(), "wrong-pod", "{r}");
    }

    /// A container created on a claim known only from its CDI spec (no
    /// tuning) while dra-plugin did not answer keeps its CPU limit's quota;
    /// once the snapshot says the claim asks for none, a quota update is
    /// due (with the unchanged cpuset), planned until sent and not again
    /// after. If it was sent before the container ran, the start sends it
    /// again. Control: the same snapshot without the tuning makes nothing due.
    #[test]
    fn a_quota_learned_after_creation_is_turned_off_once() {
        for asks in [true, false] {
            let (view, resolver) = spec_only_view(Resolution::Unverifiable("down".into()));
            let c = container("c", POD_A, &[&env(CLAIM_2, "6-7")], Some(2));
            let created = run(admit_container(&view, &c, &resolver)).expect("created");
            assert!(!created.cfs_quota_off);
            let mut v = lock(&view);
            v.note_created(Update::cpuset("c", created.cpuset.clone()));
            assert!(v.pending_updates().is_empty());

            let mut tuned = claim(CLAIM_2, "6-7", POD_A);
            tuned.tuning.cfs_quota_off = asks;
            let snapshot = NodeSnapshot {
                revision: 2,
                allocatable: set("1-7"),
                reserved: set("0"),
                mixed_allocation_mode: false,
                claims: vec![tuned],
            };
            let due = v.apply_snapshot(snapshot.clone()).expect("snapshot");
            if !asks {
                assert!(due.is_empty(), "{due:?}");
                assert!(!v.has_pending());
                assert_eq!(v.confirm_started("c"), None);
                continue;
            }
            let quota_off = Update {
                cfs_quota_off: true,
                ..Update::cpuset("c", set("6-7"))
            };
            assert_eq!(due, vec![quota_off.clone()]);
            // Deferred (no unsolicited update): still due at the next event.
            assert!(v.has_pending());
            assert_eq!(v.pending_updates(), due);
            v.mark_applied(&due);
            assert!(!v.has_pending());
            // A second snapshot finds nothing due.
            let again = NodeSnapshot {
                revision: 3,
                ..snapshot
            };
            assert!(v.apply_snapshot(again).expect("snapshot").is_empty());
            // Sent before the container ran: it may not have reached it.
            assert_eq!(v.confirm_started("c"), Some(quota_off.clone()));
            assert_eq!(v.pending_updates(), vec![quota_off]);
        }
    }

    #[test]
    fn synchronize_resolves_unknown_claims_first() {
        let view = Mutex::new(view(false));
        let resolver = TableResolver {
            answers: HashMap::from([(CLAIM_2.to_string(), prepared(claim(CLAIM_2, "6-7", POD_A)))]),
            ..Default::default()
        };
        let mut c = container("c", POD_A, &[&env(CLAIM_2, "6-7")], None);
        c.cpus = set("0-7");
        let mut s = container("s", POD_B, &[], None);
        s.cpus = set("0-7");
        let out = run(synchronize_containers(
            &view,
            &[c.clone(), s.clone(), c],
            &resolver,
        ));
        assert_eq!(out.updates, updates(&[("c", "6-7"), ("s", "1-5")]));
        assert_eq!(*lock_calls(&resolver.calls), vec![CLAIM_2.to_string()]);
    }

    /// A container of POD_B runs on CLAIM_1, whose record names POD_A only
    /// (POD_B was added to its reservedFor while nri-plugin was away). At
    /// Synchronize dra-plugin is asked for POD_B; the container keeps the
    /// claim when the answer names the pod, and only then.
    #[test]
    fn synchronize_asks_about_a_pod_the_claims_record_does_not_name() {
        let mut both = claim(CLAIM_1, "2", POD_A);
        both.consumer_pods.push(POD_B.to_string());
        // (answer for POD_B, B's update: None when it stays on the claim,
        // demoted)
        let cases: Vec<(Resolution, Option<&str>, bool)> = vec![
            (prepared(both), None, false),
            (prepared(claim(CLAIM_1, "2", POD_A)), Some("1,3-7"), true),
            (Resolution::Unverifiable("down".into()), Some("1,3-7"), true),
        ];
        for (answer, cpus, demoted) in cases {
            let mut v = view(false);
            v.apply_prepared(1, claim(CLAIM_1, "2", POD_A))
                .expect("claim 1");
            let view = Mutex::new(v);
            let resolver = TableResolver {
                for_pod: HashMap::from([(CLAIM_1.to_string(), answer.clone())]),
                ..Default::default()
            };
            let mut b = container("b", POD_B, &[&env(CLAIM_1, "2")], None);
            b.cpus = set("2");
            let mut s = container("s", POD_A, &[], None);
            s.cpus = set("0-7");
            let out = run(synchronize_containers(&view, &[b, s], &resolver));
            let b_update = out.updates.iter().find(|u| u.container_id == "b");
            assert_eq!(
                b_update.map(|u| u.cpuset.clone()),
                cpus.map(set),
                "{answer:?}: {out:?}"
            );
            assert_eq!(
                out.demoted.len(),
                usize::from(demoted),
                "{answer:?}: {out:?}"
            );
            assert_eq!(
                *lock_calls(&resolver.calls),
                vec![format!("{CLAIM_1} for {POD_B}")],
                "{answer:?}"
            );
        }
    }

    #[test]
    fn creation_asks_dra_plugin_about_a_provisional_claim_first() {
        // (answer, outcome: Ok(cfs quota off) or the refusal's reason,
        // still provisional after)
        let mut tuned = claim(CLAIM_2, "6-7", POD_A);
        tuned.tuning.cfs_quota_off = true;
        let cases: Vec<(Resolution, Result<bool, &str>, bool)> = vec![
            (prepared(tuned), Ok(true), false),
            (not_prepared(), Err("claim-not-prepared"), true),
            // dra-plugin does not answer: the spec's CPUs stand, untuned.
            (Resolution::Unverifiable("down".into()), Ok(false), true),
            (Resolution::FromCdi(set("6-7")), Ok(false), true),
        ];
        for (answer, want, provisional) in cases {
            let (view, resolver) = spec_only_view(answer.clone());
            let c = container("c", POD_A, &[&env(CLAIM_2, "6-7")], None);
            let got = run(admit_container(&view, &c, &resolver));
            match (&got, want) {
                (Ok(d), Ok(quota_off)) => {
                    assert_eq!(d.cpuset, set("6-7"), "{answer:?}");
                    assert_eq!(d.cfs_quota_off, quota_off, "{answer:?}");
                }
                (Err(r), Err(reason)) => assert_eq!(r.reason(), reason, "{answer:?}: {r}"),
                _ => panic!("{answer:?}: got {got:?}, want {want:?}"),
            }
            assert_eq!(
                *lock_calls(&resolver.calls),
                vec![CLAIM_2.to_string()],
                "asked once"
            );
            assert_eq!(
                lock(&view).is_provisional(CLAIM_2),
                provisional,
                "{answer:?}"
            );
        }
    }

    #[test]
    fn synchronize_asks_dra_plugin_about_a_provisional_claim_and_learns_its_tuning() {
        // nri-plugin restarted: the claim is known from its CDI spec only,
        // which says nothing of its pod or its tuning.
        let mut tuned = claim(CLAIM_2, "6-7", POD_A);
        tuned.tuning.load_balancing_off = true;
        let (view, resolver) = spec_only_view(prepared(tuned));
        let c = container("c", POD_A, &[&env(CLAIM_2, "6-7")], None);
        run(synchronize_containers(&view, &[c], &resolver));
        assert_eq!(*lock_calls(&resolver.calls), vec![CLAIM_2.to_string()]);
        assert!(!lock(&view).is_provisional(CLAIM_2));
        assert_eq!(lock(&view).isolated_cpus("c"), Some(set("6-7")));

        // The control: dra-plugin unreachable, the claim stays what the
        // spec says, untuned, and the container is kept on its CPUs.
        let (view, resolver) = spec_only_view(Resolution::Unverifiable("dra-plugin down".into()));
        let mut c = container("c", POD_A, &[&env(CLAIM_2, "6-7")], None);
        c.cpus = set("0-7");
        let out = run(synchronize_containers(&view, &[c], &resolver));
        assert!(lock(&view).is_provisional(CLAIM_2));
        assert_eq!(lock(&view).isolated_cpus("c"), None);
        assert!(
            out.updates
                .iter()
                .any(|u| u.container_id == "c" && u.cpuset == set("6-7")),
            "{:?}",
            out.updates
        );
    }

    /// nri-plugin reconnects while dra-plugin is down: the claim is known
    /// from its CDI spec only, the container that has it runs on its CPUs,
    /// and a copy of its env in another pod (refused earlier, on the shared
    /// pool) sorts first by id. The copy does not take the claim: the
    /// owner keeps its CPUs and the copy stays shared. Control: with the
    /// copy absent, the owner is placed the same.
    #[test]
    fn synchronize_keeps_a_provisional_claim_with_the_container_running_on_it() {
        for with_copy in [true, false] {
            let (view, resolver) =
                spec_only_view(Resolution::Unverifiable("dra-plugin down".into()));
            let mut owner = container("zzz-owner", POD_A, &[&env(CLAIM_2, "6-7")], None);
            owner.cpus = set("6-7");
            let mut copy = container("aaa-copy", POD_B, &[&env(CLAIM_2, "6-7")], None);
            copy.cpus = set("1-5");
            let running = if with_copy {
                vec![copy, owner]
            } else {
                vec![owner]
            };
            let out = run(synchronize_containers(&view, &running, &resolver));
            assert!(
                !out.updates.iter().any(|u| u.container_id == "zzz-owner"),
                "the owner is moved: {:?}",
                out.updates
            );
            let demoted: Vec<&str> = out.demoted.iter().map(|(id, _)| id.as_str()).collect();
            let want: &[&str] = if with_copy { &["aaa-copy"] } else { &[] };
            assert_eq!(demoted, want, "{:?}", out.demoted);
        }
    }

    /// Answers only once every claim of the Synchronize has been asked, so
    /// it completes only if the questions are in flight together.
    struct AllAtOnce {
        barrier: tokio::sync::Barrier,
    }

    #[async_trait::async_trait]
    impl ClaimResolver for AllAtOnce {
        async fn resolve(&self, claim_uid: &str) -> Resolution {
            self.barrier.wait().await;
            let cpus = if claim_uid == CLAIM_1 { "2" } else { "3" };
            prepared(claim(claim_uid, cpus, POD_A))
        }
    }

    /// Runs `work` on one thread against an [`AllAtOnce`] resolver: claims
    /// asked one at a time never pass its barrier, so the timeout is the
    /// failure (deadlock detection only, not a time limit).
    fn asked_at_once<T>(work: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
            .block_on(async {
                tokio::time::timeout(std::time::Duration::from_secs(30), work)
                    .await
                    .expect("the claims were asked one at a time")
            })
    }

    #[test]
    fn synchronize_asks_about_all_unknown_claims_at_once() {
        let view = Mutex::new(view(false));
        let resolver = AllAtOnce {
            barrier: tokio::sync::Barrier::new(2),
        };
        let a = container("a", POD_A, &[&env(CLAIM_1, "2")], None);
        let b = container("b", POD_A, &[&env(CLAIM_2, "3")], None);
        let out = asked_at_once(synchronize_containers(&view, &[a, b], &resolver));
        assert_eq!(out.updates, updates(&[("a", "2"), ("b", "3")]));
    }

    #[test]
    fn creation_asks_about_its_provisional_claims_at_once() {
        let mut v = view(false);
        for (uid, cpus) in [(CLAIM_1, "2"), (CLAIM_2, "3")] {
            v.learn_claim(cdi_claim(uid, set(cpus)), ClaimOrigin::CdiSpec)
                .expect("from the spec");
        }
        let view = Mutex::new(v);
        let resolver = AllAtOnce {
            barrier: tokio::sync::Barrier::new(2),
        };
        let c = container("c", POD_A, &[&env(CLAIM_1, "2"), &env(CLAIM_2, "3")], None);
        let decided = asked_at_once(admit_container(&view, &c, &resolver)).expect("admitted");
        assert_eq!(decided.cpuset, set("2-3"));
        assert!(!lock(&view).is_provisional(CLAIM_1));
        assert!(!lock(&view).is_provisional(CLAIM_2));
    }
}
