//! `ztier bench uffd`: the table and the JSON object, with costs that
//! are real measurements (positive, a round trip dearer than a page).

use std::process::Command;

fn ztier() -> &'static str {
    env!("CARGO_BIN_EXE_ztier")
}

#[test]
fn json_has_every_cost_and_the_table_names_them() {
    let o = Command::new(ztier()).args(["bench", "uffd", "--pages", "1024", "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["pages"].as_u64(), v["run"].as_u64()), (Some(1024), Some(8)), "{v}");
    let (anon, fault, page) = (
        v["anon_fault_us"].as_f64().unwrap(),
        v["fault_us"].as_f64().unwrap(),
        v["page_us"].as_f64().unwrap(),
    );
    assert!(anon > 0.0 && fault > 0.0 && page >= 0.0 && page < fault, "{v}");

    let o = Command::new(ztier()).args(["bench", "uffd", "--pages", "512", "--run", "4"]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    for want in ["kernel's own anonymous fault", "round trip", "each further page of a run of 4"] {
        assert!(text.contains(want), "{want:?} missing: {text}");
    }
}

#[test]
fn a_run_of_one_page_is_a_clear_error() {
    let o = Command::new(ztier()).args(["bench", "uffd", "--run", "1"]).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("runs of at least 2 pages"), "{err}");
}
