//! Keeps the README honest: its set-up block holds exactly the two commands a new reader
//! runs, CI runs the same test command, both scripts exist and can be run, and no relative
//! link in the documentation points at a file that is not there.
//!
//! Plain `std`: the markdown is read with a few rules that fit how these files are written
//! (fenced code blocks, inline code spans, inline links and reference definitions), not
//! with a full CommonMark parser.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The two commands of the README's set-up block, in order.
const SET_UP_COMMANDS: [&str; 2] = ["./scripts/demo", "./scripts/test"];

/// The workspace root: this crate lives in `crates/kube-proxy-rs`.
fn root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{} has no grandparent directory", manifest_dir.display()))
        .to_path_buf()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()))
}

/// The commands of the first ```sh block after the first heading that mentions "Set-up":
/// one per line, trailing `# comments` and comment-only or blank lines left out.
fn set_up_commands(readme: &str) -> Result<Vec<String>, String> {
    let mut lines = readme.lines();
    lines
        .by_ref()
        .find(|line| line.starts_with('#') && line.contains("Set-up"))
        .ok_or("README.md has no heading containing \"Set-up\"")?;
    lines
        .by_ref()
        .find(|line| line.trim() == "```sh")
        .ok_or("README.md has no ```sh code block after its \"Set-up\" heading")?;
    let mut commands = Vec::new();
    for line in lines {
        if line.trim_start().starts_with("```") {
            return Ok(commands);
        }
        let command = line.split(" #").next().unwrap_or_default().trim();
        if !command.is_empty() && !command.starts_with('#') {
            commands.push(command.to_string());
        }
    }
    Err("README.md: the ```sh block after the \"Set-up\" heading is never closed".into())
}

#[test]
fn the_set_up_block_holds_exactly_the_two_commands() {
    let commands =
        set_up_commands(&read(&root().join("README.md"))).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(
        commands, SET_UP_COMMANDS,
        "README.md: the first ```sh block after the \"Set-up\" heading must hold exactly the commands \
         {SET_UP_COMMANDS:?}, one per line (comments allowed), but it holds {commands:?}"
    );
}

#[test]
fn ci_runs_the_test_script() {
    let path = root().join(".ci/run");
    let script = read(&path);
    let runs_test_script = script
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default())
        .flat_map(str::split_whitespace)
        .map(|word| word.trim_matches(|c| c == '"' || c == '\''))
        .any(|word| word == "scripts/test" || word.ends_with("/scripts/test"));
    assert!(
        runs_test_script,
        "{} must run scripts/test (the README's test command), but no command in it names \
         scripts/test:\n{script}",
        path.display()
    );
}

#[test]
fn the_scripts_exist_and_are_executable() {
    for command in SET_UP_COMMANDS {
        let path = root().join(command.trim_start_matches("./"));
        let metadata = fs::metadata(&path).unwrap_or_else(|error| {
            panic!(
                "the README's set-up command {command} has no script at {}: {error}",
                path.display()
            )
        });
        assert!(
            metadata.is_file(),
            "the README's set-up command {command}: {} is not a file",
            path.display()
        );
        let mode = metadata.permissions().mode();
        assert!(
            mode & 0o111 != 0,
            "the README's set-up command {command}: {} is not executable (mode {mode:o}); \
             run `chmod +x {}`",
            path.display(),
            command.trim_start_matches("./")
        );
    }
}

/// README.md, ARCHITECTURE.md and every `.md` under docs/.
fn documentation_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        let entries =
            fs::read_dir(&dir).unwrap_or_else(|error| panic!("cannot list {}: {error}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|error| panic!("cannot list {}: {error}", dir.display()))
                .path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `line` without its inline code spans (`` `like this` ``), which hold no links.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let fence = &rest[start..start + ticks];
        let after = &rest[start + ticks..];
        match after.find(fence) {
            Some(end) => rest = &after[end + ticks..],
            // An unclosed backtick is literal text.
            None => {
                out.push_str(&rest[start..]);
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The destinations of the inline links (`[text](target "title")`, images too) and
/// reference definitions (`[label]: target`) of one line outside code.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let trimmed = line.trim_start();
    if let Some(rest) = trimmed.strip_prefix('[')
        && let Some((label, target)) = rest.split_once("]:")
        && !label.is_empty()
        && !label.contains('[')
    {
        targets.extend(target.split_whitespace().next().map(str::to_string));
    }
    let mut rest = line;
    while let Some(open) = rest.find("](") {
        let after = &rest[open + 2..];
        // The destination ends at the `)` that closes the one opened here.
        let mut depth = 0_usize;
        let mut end = after.len();
        for (index, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = index;
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let destination = after[..end].trim();
        let destination = match destination.strip_prefix('<') {
            Some(inner) => inner.split('>').next().unwrap_or_default(),
            None => destination.split_whitespace().next().unwrap_or_default(),
        };
        targets.push(destination.to_string());
        rest = &after[end..];
    }
    targets
}

/// Every relative link of `text` (a markdown file's contents), as written.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(open) = fence {
            if trimmed.starts_with(open) {
                fence = None;
            }
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = Some(&trimmed[..3]);
            continue;
        }
        for target in link_targets(&without_code_spans(line)) {
            let external = ["http://", "https://", "mailto:"]
                .iter()
                .any(|scheme| target.starts_with(scheme));
            if !target.is_empty() && !external && !target.starts_with('#') {
                links.push(target);
            }
        }
    }
    links
}

/// Minimal percent-decoding: enough for `%20` and friends in file names.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = bytes
            .get(index + 1..index + 3)
            .and_then(|pair| std::str::from_utf8(pair).ok())
            .and_then(|pair| u8::from_str_radix(pair, 16).ok());
        match (bytes[index], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                index += 3;
            }
            (byte, _) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn every_relative_link_in_the_documentation_points_at_a_file_that_exists() {
    let root = root();
    let files = documentation_files(&root);
    assert!(
        files.iter().any(|file| file.starts_with(root.join("docs"))),
        "docs/ holds no .md file: the README's documentation links have nowhere to go"
    );
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let base = file
            .parent()
            .unwrap_or_else(|| panic!("{} has no parent directory", file.display()));
        for link in relative_links(&read(file)) {
            let path = link.split(['#', '?']).next().unwrap_or_default();
            let path = percent_decoded(path);
            let resolved = match path.strip_prefix('/') {
                Some(from_root) => root.join(from_root),
                None => base.join(&path),
            };
            checked += 1;
            if !resolved.exists() {
                let shown = file.strip_prefix(&root).unwrap_or(file);
                broken.push(format!(
                    "{}: ({link}) -> {} does not exist",
                    shown.display(),
                    resolved.display()
                ));
            }
        }
    }
    assert!(
        checked > 0,
        "no relative link found in {files:?}: the link reader is broken"
    );
    assert!(
        broken.is_empty(),
        "{} relative link(s) point at files that do not exist:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_markdown_reader_finds_what_it_should() {
    let text = "See [a](docs/a.md#x), ![img](b.png \"title\"), [c](<c d.md>) and `[no](code.md)`.\n\
                [ref]: e.md\n\
                [web](https://example.com) [anchor](#here) [f(g)](f(g).md)\n\
                ```sh\n[fenced](fenced.md)\n```\n";
    assert_eq!(
        relative_links(text),
        ["docs/a.md#x", "b.png", "c d.md", "e.md", "f(g).md"],
        "the link reader's own check: expected links were not found"
    );
    let readme = "# x\n## Set-up: the two commands\n\n```sh\n./a   # one\n\n# note\n./b\n```\n";
    assert_eq!(
        set_up_commands(readme),
        Ok(vec!["./a".to_string(), "./b".to_string()])
    );
}
