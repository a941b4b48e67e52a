//! Compiles bpf/socket_lb.c into OUT_DIR with clang (`-O2 -g -target bpf`); the object is
//! embedded in the crate. A second object, built with `KPR_REFUSED_BY_THE_VERIFIER`, has one
//! program the kernel refuses: the kernel tests load it to see a refusal reported and
//! nothing left behind. Needs Debian's `clang` (any of 14, 15, 16) and the kernel's UAPI
//! headers (`linux-libc-dev`, installed with any C toolchain). `BPF_CLANG` names another
//! clang.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let source = manifest.join("bpf/socket_lb.c");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    for (object, defines) in [
        ("socket_lb.o", &[][..]),
        ("socket_lb_refused.o", &["-DKPR_REFUSED_BY_THE_VERIFIER"][..]),
    ] {
        let built = compile(&source, &out_dir.join(object), defines);
        if built != ExitCode::SUCCESS {
            return built;
        }
    }
    ExitCode::SUCCESS
}

fn compile(source: &Path, out: &Path, defines: &[&str]) -> ExitCode {
    let clang = env::var("BPF_CLANG").unwrap_or_else(|_| "clang".to_owned());
    // `-target bpf` leaves out the multiarch include directory, where <asm/types.h> lives.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".to_owned());
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .args(defines)
        .arg(format!("-I/usr/include/{arch}-linux-gnu"))
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(out)
        .status();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("error: {clang} failed ({status}) on {}", source.display());
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!(
                "error: kpr-ebpf compiles its BPF programs with clang, and `{clang}` could not be run ({error}): \
                 install Debian's package `clang` (apt-get install -y clang), or set BPF_CLANG to a clang binary"
            );
            ExitCode::FAILURE
        }
    }
}
