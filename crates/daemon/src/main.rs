//! plimsolld: parses arguments and settings, then serves.

fn main() {
    eprintln!("plimsolld: not built yet");
    std::process::exit(1);
}
