//! The serving side: a provider whose every call is a request to the launcher.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use plimsoll_sandbox::{
    CancelRunError, LaunchError, LaunchPlan, Outcome, Probed, Provider, RunImage, RunningIn, Stale,
    Teardown, Unsupported, WarmMember, WarmPlan, Withdrawn,
};
use plimsoll_wire::launch::{DescribedProvider, LaunchAnswer, LaunchEvent, LaunchRequest};
use plimsoll_wire::{Evidence, Reason, RunSpec, Tier};

use super::conn::{Receiver, Sender, split};
use super::{failure_from_wire, image_to_wire, member_to_wire, plan_to_wire, probed_from_wire};

/// One provider the launcher at `socket` hosts.
#[derive(Debug)]
pub struct Remote {
    socket: PathBuf,
    described: DescribedProvider,
}

/// The launcher did not answer as it should.
fn broken(e: impl std::fmt::Display) -> String {
    format!("the launcher did not answer: {e}; check that it runs (plimsolld launcher)")
}

impl Remote {
    /// Every provider the launcher at `socket` hosts, in its settings' order.
    pub fn all(socket: &Path) -> io::Result<Vec<Remote>> {
        match ask(socket, &LaunchRequest::Describe)? {
            LaunchAnswer::Described(list) => Ok(list
                .into_iter()
                .map(|described| Remote {
                    socket: socket.to_owned(),
                    described,
                })
                .collect()),
            other => Err(unexpected(&other)),
        }
    }

    fn ask(&self, request: &LaunchRequest) -> Result<LaunchAnswer, String> {
        ask(&self.socket, request).map_err(broken)
    }

    /// A yes-or-why-not question.
    fn done(&self, request: &LaunchRequest) -> Result<(), String> {
        match self.ask(request)? {
            LaunchAnswer::Done(r) => r,
            other => Err(broken(unexpected(&other))),
        }
    }

    fn name_owned(&self) -> String {
        self.described.name.clone()
    }
}

fn connect(socket: &Path) -> io::Result<(Sender, Receiver)> {
    split(UnixStream::connect(socket)?)
}

/// One request, one answer (no events).
fn ask(socket: &Path, request: &LaunchRequest) -> io::Result<LaunchAnswer> {
    let (tx, mut rx) = connect(socket)?;
    tx.send(request, None)?;
    match rx.expect::<LaunchEvent>()? {
        LaunchEvent::Answer(a) => match *a {
            LaunchAnswer::Refused(why) => Err(io::Error::other(format!("it refused: {why}"))),
            a => Ok(a),
        },
        other => Err(io::Error::other(format!(
            "an event with no run under way: {other:?}"
        ))),
    }
}

fn unexpected(a: &LaunchAnswer) -> io::Error {
    io::Error::other(format!("an answer to another question: {a:?}"))
}

impl Provider for Remote {
    fn name(&self) -> &str {
        &self.described.name
    }
    fn nominal_tier(&self) -> Tier {
        self.described.nominal_tier
    }
    fn cost(&self) -> u32 {
        self.described.cost
    }
    fn uses_image(&self) -> bool {
        self.described.uses_image
    }
    fn supports_broker(&self) -> bool {
        self.described.supports_broker
    }
    fn supports_egress(&self) -> bool {
        self.described.supports_egress
    }
    fn warms(&self) -> bool {
        self.described.warms
    }
    fn warm(&self, plan: &WarmPlan) -> Result<Box<dyn WarmMember>, LaunchError> {
        let not_started = |e: String| LaunchError::not_started(Reason::Environment, e);
        let (tx, mut rx) = connect(&self.socket).map_err(|e| not_started(broken(e)))?;
        tx.send(
            &LaunchRequest::Warm {
                provider: self.name_owned(),
                plan: member_to_wire(plan),
            },
            None,
        )
        .map_err(|e| not_started(broken(e)))?;
        let answer = match rx.expect::<LaunchEvent>() {
            Ok(LaunchEvent::Answer(a)) => *a,
            Ok(other) => return Err(not_started(broken(format!("{other:?}")))),
            Err(e) => return Err(not_started(broken(e))),
        };
        match answer {
            LaunchAnswer::Warmed(Ok(uid)) => Ok(Box::new(RemoteMember {
                provider: self.name_owned(),
                uid,
                tx,
                rx,
            })),
            LaunchAnswer::Warmed(Err(f)) => Err(failure_from_wire(f)),
            LaunchAnswer::Refused(why) => Err(not_started(format!(
                "the launcher refused the member: {why}"
            ))),
            other => Err(not_started(broken(unexpected(&other)))),
        }
    }
    fn supports(&self, spec: &RunSpec) -> Result<(), Unsupported> {
        self.done(&LaunchRequest::Supports {
            provider: self.name_owned(),
            spec: spec.clone(),
        })
        .map_err(Unsupported::Said)
    }
    fn takes_image(&self, image: &RunImage) -> Result<(), Unsupported> {
        self.done(&LaunchRequest::TakesImage {
            provider: self.name_owned(),
            image: image_to_wire(image),
        })
        .map_err(Unsupported::Said)
    }
    fn memory_floor(&self, spec: &RunSpec) -> Option<u64> {
        match self.ask(&LaunchRequest::MemoryFloor {
            provider: self.name_owned(),
            spec: spec.clone(),
        }) {
            Ok(LaunchAnswer::Floor(floor)) => floor,
            // No answer: the run goes on to the launcher, whose answer to it says why.
            _ => None,
        }
    }
    fn probe(&self) -> Probed {
        match self.ask(&LaunchRequest::Probe {
            provider: self.name_owned(),
        }) {
            Ok(LaunchAnswer::Probed(p)) => probed_from_wire(p),
            Ok(other) => self.not_probed(broken(unexpected(&other))),
            Err(why) => self.not_probed(why),
        }
    }
    fn adopt(&self, evidence: &Evidence) -> Result<(), Stale> {
        self.done(&LaunchRequest::Adopt {
            provider: self.name_owned(),
            evidence: evidence.clone(),
        })
        .map_err(Stale::Said)
    }
    fn environment_holds(&self, evidence: &Evidence) -> Result<(), Stale> {
        self.done(&LaunchRequest::EnvironmentHolds {
            provider: self.name_owned(),
            evidence: evidence.clone(),
        })
        .map_err(Stale::Said)
    }
    fn run(&self, plan: &LaunchPlan) -> Result<Outcome, LaunchError> {
        let (outcome, teardown) = self.run_then_tear_down(plan)?;
        if let Some(t) = teardown {
            t.run()
                .map_err(|e| LaunchError::may_have_run(e.to_string()))?;
        }
        Ok(outcome)
    }
    fn run_then_tear_down(
        &self,
        plan: &LaunchPlan,
    ) -> Result<(Outcome, Option<Teardown>), LaunchError> {
        let not_started = |e: String| LaunchError::not_started(Reason::Environment, e);
        let (tx, rx) = connect(&self.socket).map_err(|e| not_started(broken(e)))?;
        tx.send(
            &LaunchRequest::Run {
                provider: self.name_owned(),
                plan: plan_to_wire(plan),
            },
            None,
        )
        .map_err(|e| not_started(broken(e)))?;
        follow(plan, tx, rx)
    }
    fn cancel(&self, sandbox: &RunningIn) -> Result<(), CancelRunError> {
        self.done(&LaunchRequest::Cancel {
            provider: self.name_owned(),
            id: sandbox.id.clone(),
            uid: sandbox.uid,
        })
        .map_err(|why| CancelRunError::End {
            sandbox: sandbox.id.clone(),
            uid: sandbox.uid,
            cause: why.into(),
        })
    }
}

impl Remote {
    fn not_probed(&self, why: String) -> Probed {
        let mut checks = std::collections::BTreeMap::new();
        checks.insert("launcher".to_owned(), why.clone());
        Probed {
            tier: self.described.nominal_tier,
            evidence: Evidence {
                provider: self.name_owned(),
                isolation: self.described.nominal_tier,
                config: Default::default(),
                binaries: Vec::new(),
                probe: None,
                checks,
                environment: String::new(),
                checked_unix_ms: plimsoll_sandbox::unix_ms_now(),
            },
            available: Err(Withdrawn::NotProbed(why)),
        }
    }
}

impl Remote {
    /// A run's answer as the engine takes it; `tx` and `rx` stay open for the teardown.
    fn ran(
        answer: LaunchAnswer,
        tx: Sender,
        mut rx: Receiver,
    ) -> Result<(Outcome, Option<Teardown>), LaunchError> {
        let ran = match answer {
            LaunchAnswer::Refused(why) => {
                return Err(LaunchError::not_started(
                    Reason::Environment,
                    format!("the launcher refused the plan: {why}"),
                ));
            }
            LaunchAnswer::Ran(Err(f)) => return Err(failure_from_wire(f)),
            LaunchAnswer::Ran(Ok(ran)) => ran,
            other => return Err(LaunchError::may_have_run(broken(unexpected(&other)))),
        };
        let outcome = Outcome {
            result: ran.result,
            started_unix_ms: ran.started_unix_ms,
            ended_unix_ms: ran.ended_unix_ms,
        };
        let teardown = ran.teardown.then(|| {
            Teardown::new(move || {
                tx.send(&LaunchRequest::TearDown, None)
                    .map_err(|e| broken(e).into())
                    .and_then(|()| match rx.expect::<LaunchEvent>() {
                        Ok(LaunchEvent::Answer(a)) => match *a {
                            LaunchAnswer::Done(r) => r.map_err(Into::into),
                            other => Err(broken(format!("{other:?}")).into()),
                        },
                        Ok(other) => Err(broken(format!("{other:?}")).into()),
                        Err(e) => Err(broken(e).into()),
                    })
            })
        });
        Ok((outcome, teardown))
    }
}

/// Follows a run sent on `tx`: its events, then its answer.
fn follow(
    plan: &LaunchPlan,
    tx: Sender,
    mut rx: Receiver,
) -> Result<(Outcome, Option<Teardown>), LaunchError> {
    // Once the plan is sent, the code may run: a launcher gone after it is not "nothing ran".
    let lost = |e: io::Error| LaunchError::may_have_run(broken(e));
    loop {
        match rx.expect::<LaunchEvent>().map_err(lost)? {
            LaunchEvent::Output {
                stream,
                offset,
                bytes,
            } => {
                if let Some(tap) = &plan.tap {
                    tap.send(stream, offset, bytes.as_slice());
                }
            }
            LaunchEvent::BrokerStream => {
                let fd = rx.take_fd().map_err(lost)?;
                if let Some(b) = &plan.broker {
                    b.serve_stream(UnixStream::from(fd)).map_err(lost)?;
                }
            }
            LaunchEvent::BrokerListener => {
                let fd = rx.take_fd().map_err(lost)?;
                if let Some(b) = &plan.broker {
                    b.serve_listener(UnixListener::from(fd)).map_err(lost)?;
                }
            }
            LaunchEvent::Answer(answer) => return Remote::ran(*answer, tx, rx),
        }
    }
}

/// A warm member the launcher holds, on a connection of its own.
#[derive(Debug)]
struct RemoteMember {
    provider: String,
    uid: u32,
    tx: Sender,
    rx: Receiver,
}

impl WarmMember for RemoteMember {
    fn uid(&self) -> u32 {
        self.uid
    }
    fn run(self: Box<Self>, plan: &LaunchPlan) -> Result<(Outcome, Teardown), LaunchError> {
        let RemoteMember {
            provider, tx, rx, ..
        } = *self;
        tx.send(
            &LaunchRequest::Run {
                provider,
                plan: plan_to_wire(plan),
            },
            None,
        )
        .map_err(|e| LaunchError::not_started(Reason::Environment, broken(e)))?;
        let (outcome, teardown) = follow(plan, tx, rx)?;
        Ok((
            outcome,
            teardown.unwrap_or_else(|| Teardown::new(|| Ok(()))),
        ))
    }
    fn discard(self: Box<Self>) -> Result<(), plimsoll_sandbox::Cause> {
        let RemoteMember { tx, mut rx, .. } = *self;
        tx.send(&LaunchRequest::Discard, None).map_err(broken)?;
        match rx.expect::<LaunchEvent>().map_err(broken)? {
            LaunchEvent::Answer(a) => match *a {
                LaunchAnswer::Done(r) => r.map_err(Into::into),
                other => Err(broken(unexpected(&other)).into()),
            },
            other => Err(broken(format!("{other:?}")).into()),
        }
    }
}
