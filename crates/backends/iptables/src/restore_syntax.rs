//! What a restore payload may look like, read the way `iptables-restore` reads it.
//!
//! The renderer only means to write five line forms (`*table`, `:CHAIN - [0:0]`,
//! `-A CHAIN args`, `-X CHAIN`, `COMMIT`), each table closed by `COMMIT`, chains declared
//! before use. Any other line in the text means some string reached the payload unchecked
//! (a newline in a name starts a line the renderer never wrote). The arguments of `-A` are
//! split as `iptables-restore` splits them ([`split_args`]: blanks separate; a double quote
//! opens a part in which a backslash escapes the next character, and the closing quote ends
//! the argument), and each must be one any iptables version reads the same way: not empty,
//! no quote or backslash inside, not taken for a table option, shorter than iptables' limits;
//! a `--comment` fits the kernel's 255 bytes.
//!
//! Not on the sync path: kpr-naming's text gate and the typed rule builder already make
//! these lines the only ones the renderer can write. This is the independent reader the
//! property tests (`tests/rule_text.rs`) and the fuzz targets (kpr-fuzz-targets) hold every
//! payload to.

use std::collections::BTreeSet;
use std::fmt;

use kpr_naming::CHAIN_NAME_MAX_BYTES;
use kpr_naming::text::COMMENT_MAX_BYTES;

/// iptables refuses arguments of 1024 bytes or more, and lines of 4096 or more.
const ARG_MAX_BYTES: usize = 1023;
const LINE_MAX_BYTES: usize = 4095;
/// iptables-restore's limit on the arguments of one line.
const ARGS_MAX: usize = 254;

/// The first thing wrong with a payload: which line (1-based) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadError {
    pub line: usize,
    pub text: String,
    pub why: String,
}

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "payload line {}: {} ({:?})", self.line, self.why, self.text)
    }
}

impl std::error::Error for PayloadError {}

/// Checks `payload` line by line; `Ok` when every line is one the renderer means to write.
pub fn check_payload(payload: &str) -> Result<(), PayloadError> {
    if let Some(c) = payload.chars().find(|c| c.is_control() && *c != '\n') {
        let line = payload.split('\n').position(|l| l.contains(c)).unwrap_or(0) + 1;
        return Err(PayloadError {
            line,
            text: payload.split('\n').nth(line - 1).unwrap_or_default().to_owned(),
            why: format!("control character {c:?}"),
        });
    }
    if !payload.is_empty() && !payload.ends_with('\n') {
        return Err(error(0, "", "payload does not end with a newline"));
    }
    let mut reader = Reader::default();
    for (index, line) in payload.lines().enumerate() {
        if line.len() > LINE_MAX_BYTES {
            return Err(error(index + 1, line, &format!("line of {} bytes", line.len())));
        }
        reader.line(line).map_err(|why| error(index + 1, line, &why))?;
    }
    if let Some(table) = reader.table {
        return Err(error(0, "", &format!("table {table} is never committed")));
    }
    Ok(())
}

fn error(line: usize, text: &str, why: &str) -> PayloadError {
    PayloadError {
        line,
        text: text.to_owned(),
        why: why.to_owned(),
    }
}

/// Where the reader is: inside a table (and which chains it declared) or between tables.
#[derive(Default)]
struct Reader {
    table: Option<String>,
    declared: BTreeSet<String>,
}

impl Reader {
    fn line(&mut self, line: &str) -> Result<(), String> {
        let Some(table) = &self.table else {
            return self.open_table(line);
        };
        if line == "COMMIT" {
            self.table = None;
            self.declared.clear();
            return Ok(());
        }
        if let Some(rest) = line.strip_prefix(':') {
            let name = rest
                .strip_suffix(" - [0:0]")
                .ok_or_else(|| "declaration not of the form `:CHAIN - [0:0]`".to_owned())?;
            chain_name(name)?;
            self.declared.insert(name.to_owned());
            return Ok(());
        }
        if let Some(name) = line.strip_prefix("-X ") {
            return self.declared_chain(table, name);
        }
        if let Some(rest) = line.strip_prefix("-A ") {
            let (name, args) = rest
                .split_once(' ')
                .ok_or_else(|| "-A without a rule".to_owned())?;
            self.declared_chain(table, name)?;
            return rule_args(args);
        }
        Err("not a line the renderer writes".to_owned())
    }

    fn open_table(&mut self, line: &str) -> Result<(), String> {
        match line.strip_prefix('*') {
            Some(table @ ("filter" | "nat" | "mangle")) => {
                self.table = Some(table.to_owned());
                Ok(())
            }
            _ => Err("expected `*filter`, `*nat` or `*mangle` between tables".to_owned()),
        }
    }

    fn declared_chain(&self, table: &str, name: &str) -> Result<(), String> {
        chain_name(name)?;
        if self.declared.contains(name) {
            Ok(())
        } else {
            Err(format!("chain {name} is not declared in table {table}"))
        }
    }
}

/// Chain names as the renderer makes them: upstream's `KUBE-...` names.
fn chain_name(name: &str) -> Result<(), String> {
    let plain = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if name.is_empty() || name.len() > CHAIN_NAME_MAX_BYTES || !plain {
        return Err(format!("bad chain name {name:?}"));
    }
    Ok(())
}

/// Splits rule arguments as `iptables-restore` does and checks each.
fn rule_args(args: &str) -> Result<(), String> {
    let words = split_args(args)?;
    if words.is_empty() {
        return Err("-A without a rule".to_owned());
    }
    if words.len() + 2 > ARGS_MAX {
        return Err(format!("{} arguments", words.len() + 2));
    }
    for word in &words {
        arg(word)?;
    }
    for pair in words.windows(2) {
        if pair[0] == "--comment" && pair[1].len() > COMMENT_MAX_BYTES {
            return Err(format!(
                "comment of {} bytes is over the kernel's {COMMENT_MAX_BYTES}",
                pair[1].len()
            ));
        }
    }
    if words.last().is_some_and(|w| w == "--comment") {
        return Err("--comment without its text".to_owned());
    }
    Ok(())
}

/// One argument every iptables version reads the same way.
fn arg(word: &str) -> Result<(), String> {
    if word.is_empty() {
        // Older versions drop an empty quoted argument, shifting the others.
        return Err("empty argument".to_owned());
    }
    if word.len() > ARG_MAX_BYTES {
        return Err(format!("argument of {} bytes", word.len()));
    }
    if word.contains(['"', '\\']) {
        // Versions differ in how they unescape; only plain text is read the same by all.
        return Err(format!("argument {word:?} holds a quote or backslash"));
    }
    if looks_like_table_option(word) {
        return Err(format!(
            "argument {word:?} reads as a table option to older iptables-restore"
        ));
    }
    Ok(())
}

/// Older iptables-restore versions refuse any argument, quoted or not, that could be the
/// table option: one dash and a `t` somewhere (`-t`, `-xt`), or `--t` up to `--table`.
pub fn looks_like_table_option(word: &str) -> bool {
    let short = word.starts_with('-') && !word.starts_with("--") && word.contains('t');
    let long = word.starts_with("--t") && "--table".starts_with(word);
    short || long
}

/// The argument words of one rule as iptables-restore reads them: blanks separate; `"`
/// opens a quoted part in which `\` escapes the next character, and the closing quote ends
/// the argument. An unclosed quote is an error.
pub fn split_args(args: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut chars = args.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if !current.is_empty() {
                    words.push(std::mem::take(&mut current));
                }
            }
            '"' => {
                loop {
                    match chars.next() {
                        None => return Err("unclosed double quote".to_owned()),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(escaped) => current.push(escaped),
                            None => return Err("unclosed double quote".to_owned()),
                        },
                        Some(other) => current.push(other),
                    }
                }
                words.push(std::mem::take(&mut current));
            }
            other => current.push(other),
        }
    }
    if !current.is_empty() {
        words.push(current);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(payload: &str) -> String {
        check_payload(payload).unwrap_err().why
    }

    #[test]
    fn accepts_the_forms_the_renderer_writes() {
        let payload = "*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n\
            -A KUBE-SERVICES -m comment --comment \"ns/a:http has no endpoints\" -j REJECT\n\
            -X KUBE-SVC-X\nCOMMIT\n*nat\nCOMMIT\n";
        assert_eq!(check_payload(payload), Ok(()));
        assert_eq!(check_payload(""), Ok(()));
    }

    #[test]
    fn a_line_the_renderer_did_not_mean_is_refused() {
        let injected = "*filter\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m comment --comment \"evil\n\
            -A KUBE-SERVICES -j ACCEPT\n#\" -j REJECT\nCOMMIT\n";
        let error = check_payload(injected).unwrap_err();
        assert_eq!(error.line, 3, "{error}");
        assert_eq!(
            why("*filter\n-F KUBE-SERVICES\nCOMMIT\n"),
            "not a line the renderer writes"
        );
        assert_eq!(
            why("*raw\nCOMMIT\n"),
            "expected `*filter`, `*nat` or `*mangle` between tables"
        );
        assert_eq!(why("*nat\n:KUBE-A - [0:0]\n"), "table nat is never committed");
        assert_eq!(
            why("*nat\n:KUBE-A - [0:0]\nCOMMIT"),
            "payload does not end with a newline"
        );
    }

    #[test]
    fn chains_must_be_declared_in_their_table() {
        let payload = "*filter\n:KUBE-A - [0:0]\nCOMMIT\n*nat\n-A KUBE-A -j ACCEPT\nCOMMIT\n";
        assert_eq!(why(payload), "chain KUBE-A is not declared in table nat");
        assert_eq!(
            why("*nat\n:KUBE A - [0:0]\nCOMMIT\n"),
            "bad chain name \"KUBE A\""
        );
        let long = format!("*nat\n:{} - [0:0]\nCOMMIT\n", "K".repeat(29));
        assert!(why(&long).starts_with("bad chain name"));
        assert_eq!(
            why("*nat\n:KUBE-A -\nCOMMIT\n"),
            "declaration not of the form `:CHAIN - [0:0]`"
        );
    }

    #[test]
    fn control_characters_other_than_newline_are_refused() {
        for c in ['\r', '\0', '\t', '\u{1b}', '\u{85}'] {
            let payload =
                format!("*nat\n:KUBE-A - [0:0]\n-A KUBE-A -m comment --comment \"a{c}b\" -j X\nCOMMIT\n");
            let error = check_payload(&payload).unwrap_err();
            assert_eq!(error.line, 3, "{c:?}");
            assert!(error.why.starts_with("control character"), "{c:?}: {error}");
        }
    }

    #[test]
    fn quotes_must_balance_and_comments_fit_the_kernel() {
        let rule = |args: &str| format!("*nat\n:KUBE-A - [0:0]\n-A KUBE-A {args}\nCOMMIT\n");
        assert_eq!(
            why(&rule("-m comment --comment \"open -j X")),
            "unclosed double quote"
        );
        assert_eq!(why(&rule("-m comment --comment")), "--comment without its text");
        assert_eq!(
            why(&rule(r#"--comment "say \"hi\"" -j X"#)),
            "argument \"say \\\"hi\\\"\" holds a quote or backslash"
        );
        let fits = format!("--comment \"{}\" -j X", "c".repeat(COMMENT_MAX_BYTES));
        assert_eq!(check_payload(&rule(&fits)), Ok(()));
        let over = format!("--comment {} -j X", "c".repeat(COMMENT_MAX_BYTES + 1));
        assert!(why(&rule(&over)).starts_with("comment of 256 bytes"));
    }

    #[test]
    fn arguments_are_read_as_iptables_restore_reads_them() {
        assert_eq!(split_args(r#"a"b c"d  -j"#).unwrap(), ["ab c", "d", "-j"]);
        assert_eq!(split_args(r#""x\"y""#).unwrap(), [r#"x"y"#]);
        let rule = |args: &str| format!("*nat\n:KUBE-A - [0:0]\n-A KUBE-A {args}\nCOMMIT\n");
        assert_eq!(why(&rule(r#"--comment "" -j X"#)), "empty argument");
        for option in ["-t", "-xt", "--t", "--tab", "--table"] {
            let error = why(&rule(&format!("--comment \"{option}\" -j X")));
            assert!(
                error.ends_with("reads as a table option to older iptables-restore"),
                "{option}: {error}"
            );
        }
        assert_eq!(check_payload(&rule("--comment --tables -j X")), Ok(()));
        let long = format!("-s {} -j X", "a".repeat(1024));
        assert_eq!(why(&rule(&long)), "argument of 1024 bytes");
        let many = vec!["-j X"; 130].join(" ");
        assert_eq!(why(&rule(&many)), "262 arguments");
        let wide = format!(
            "*nat\n:KUBE-A - [0:0]\n-A KUBE-A {}\nCOMMIT\n",
            "-m x ".repeat(900)
        );
        assert!(why(&wide).starts_with("line of"));
    }
}
