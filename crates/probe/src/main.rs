//! The probe: run inside a sandbox, prints a `ProbeReport` as JSON on stdout.

fn main() {
    let report = plimsoll_wire::ProbeReport::default();
    println!("{}", serde_json::to_string(&report).expect("report serialises"));
}
