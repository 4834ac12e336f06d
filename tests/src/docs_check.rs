//! The README and the pages under `docs/` as a reader follows them: every
//! `--flag` they name for dra-plugin or nri-plugin is one the binary's
//! `--help` lists, every flag named for a script is in that script, and
//! every relative link reaches a file (and heading) of the repository.
//!
//! Whose flag it is comes from where it is written:
//! - a code-block line that runs `dra-plugin [subcommand]` or `nri-plugin`
//!   (after `--` too, as in `kubectl exec ... -- /usr/bin/dra-plugin`), or an
//!   inline code span that starts with one: that command's;
//! - a span or code line starting with `scripts/x.sh`: that script's;
//! - a span that starts with the flag, inside a section marked
//!   `<!-- flags: dra-plugin run, nri-plugin -->` (up to the next heading):
//!   one of those commands' (a marker naming another program, such as
//!   `docker build`, leaves its flags unchecked);
//! - any other span starting with the flag: some command's or script's of
//!   the repository;
//! - a span or line starting with any other program (`cargo`, `kubectl`,
//!   `helm`): not checked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// The programs of this repository whose `--help` the pages are held to.
pub const DAEMONS: [&str; 2] = ["dra-plugin", "nri-plugin"];

/// A Markdown page, its path relative to the repository.
#[derive(Debug, Clone)]
pub struct Page {
    pub path: PathBuf,
    pub text: String,
}

/// `README.md` and every `docs/**/*.md`.
pub fn pages(repo: &Path) -> std::io::Result<Vec<Page>> {
    let mut paths = vec![PathBuf::from("README.md")];
    markdown_under(repo, Path::new("docs"), &mut paths)?;
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(repo.join(&path))?;
            Ok(Page { path, text })
        })
        .collect()
}

fn markdown_under(repo: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(repo.join(dir))? {
        let entry = entry?;
        let path = dir.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            markdown_under(repo, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    Ok(())
}

/// Whose flag a mention is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// `dra-plugin run`, `dra-plugin inspect`, `nri-plugin`, ...
    Command(String),
    /// A script by its path in the repository.
    Script(String),
    /// One of the commands of a `<!-- flags: ... -->` section.
    AnyOf(Vec<String>),
    /// Not said: a flag of any command or script of the repository.
    Unsaid,
}

/// One `--flag` written on a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagMention {
    pub page: PathBuf,
    pub line: usize,
    pub flag: String,
    pub owner: Owner,
}

/// One relative link written on a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub page: PathBuf,
    pub line: usize,
    pub target: String,
}

/// The flags and links of a page.
pub fn read_page(page: &Page) -> (Vec<FlagMention>, Vec<Link>) {
    let mut reader = Reader {
        page: page.path.clone(),
        section: None,
        flags: Vec::new(),
        links: Vec::new(),
    };
    let mut in_code = false;
    let mut paragraph: Vec<(usize, &str)> = Vec::new();
    let mut command: Option<(usize, String)> = None;
    for (index, line) in page.text.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            reader.paragraph(&paragraph);
            paragraph.clear();
            in_code = !in_code;
            command = None;
            continue;
        }
        if in_code {
            let (start, mut text) = command.take().unwrap_or((number, String::new()));
            match trimmed.strip_suffix('\\') {
                Some(head) => {
                    text.push_str(head);
                    text.push(' ');
                    command = Some((start, text));
                }
                None => {
                    text.push_str(trimmed);
                    reader.code_line(start, &text);
                }
            }
            continue;
        }
        if trimmed.is_empty() || is_heading(trimmed) || section_marker(trimmed).is_some() {
            reader.paragraph(&paragraph);
            paragraph.clear();
            if is_heading(trimmed) {
                reader.section = None;
                reader.paragraph(&[(number, line)]);
            } else if let Some(commands) = section_marker(trimmed) {
                reader.section = Some(commands);
            }
            continue;
        }
        paragraph.push((number, line));
    }
    reader.paragraph(&paragraph);
    (reader.flags, reader.links)
}

struct Reader {
    page: PathBuf,
    section: Option<Vec<String>>,
    flags: Vec<FlagMention>,
    links: Vec<Link>,
}

impl Reader {
    fn mention(&mut self, line: usize, flag: String, owner: Owner) {
        self.flags.push(FlagMention {
            page: self.page.clone(),
            line,
            flag,
            owner,
        });
    }

    fn code_line(&mut self, line: usize, text: &str) {
        let words: Vec<&str> = text
            .split_whitespace()
            .take_while(|w| !w.starts_with('#'))
            .collect();
        let Some((owner, rest)) = owner_of(&words, true) else {
            return;
        };
        for flag in rest.iter().filter_map(|w| flag_in(w)) {
            self.mention(line, flag, owner.clone());
        }
    }

    fn paragraph(&mut self, lines: &[(usize, &str)]) {
        let Some(&(first, _)) = lines.first() else {
            return;
        };
        let text: String = lines.iter().map(|(_, l)| *l).collect::<Vec<_>>().join("\n");
        for (offset, span) in code_spans(&text) {
            let line = first + text[..offset].matches('\n').count();
            let words: Vec<&str> = span.split_whitespace().collect();
            if words.first().is_some_and(|w| w.starts_with("--")) {
                let owner = match &self.section {
                    Some(commands) => Owner::AnyOf(commands.clone()),
                    None => Owner::Unsaid,
                };
                for flag in words.iter().filter_map(|w| flag_in(w)) {
                    self.mention(line, flag, owner.clone());
                }
            } else if let Some((owner, rest)) = owner_of(&words, false) {
                for flag in rest.iter().filter_map(|w| flag_in(w)) {
                    self.mention(line, flag, owner.clone());
                }
            }
        }
        for (offset, target) in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let line = first + text[..offset].matches('\n').count();
            self.links.push(Link {
                page: self.page.clone(),
                line,
                target,
            });
        }
    }
}

fn is_heading(line: &str) -> bool {
    let hashes = line.chars().take_while(|c| *c == '#').count();
    (1..=6).contains(&hashes) && line[hashes..].starts_with(' ')
}

/// `<!-- flags: dra-plugin run, nri-plugin -->` → its commands.
fn section_marker(line: &str) -> Option<Vec<String>> {
    let inner = line.strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    let list = inner.strip_prefix("flags:")?;
    Some(
        list.split(',')
            .map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|c| !c.is_empty())
            .collect(),
    )
}

/// Who owns the flags of a command line, and the words after the command.
/// In a code block the command may follow `--` (`kubectl exec ... --`) or
/// `sudo` and environment assignments.
fn owner_of<'a>(words: &'a [&'a str], in_code: bool) -> Option<(Owner, &'a [&'a str])> {
    let mut start = 0;
    while in_code
        && words
            .get(start)
            .is_some_and(|w| *w == "sudo" || (w.contains('=') && !w.starts_with('-')))
    {
        start += 1;
    }
    let at = if in_code {
        (start..words.len()).find(|&i| {
            is_daemon(words[i]) && (i == start || words[i - 1] == "--" || words[i - 1] == "exec")
        })
    } else {
        Some(start).filter(|&i| words.get(i).is_some_and(|w| is_daemon(w)))
    };
    if let Some(at) = at {
        let program = basename(words[at]);
        let rest = &words[at + 1..];
        return Some(match rest.first() {
            Some(sub) if program == "dra-plugin" && sub.chars().all(|c| c.is_ascii_lowercase()) => {
                (Owner::Command(format!("{program} {sub}")), &rest[1..])
            }
            _ => (Owner::Command(program.to_string()), rest),
        });
    }
    let first = words.get(start)?;
    if first.ends_with(".sh") {
        let path = if first.contains('/') {
            first.trim_start_matches("./").to_string()
        } else {
            format!("scripts/{first}")
        };
        return Some((Owner::Script(path), &words[start + 1..]));
    }
    None
}

fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

fn is_daemon(word: &str) -> bool {
    DAEMONS.contains(&basename(word))
}

/// `--flag`, `--flag=value`, `[--flag` → `--flag`.
fn flag_in(word: &str) -> Option<String> {
    let word = word.trim_start_matches(['[', '(', '"', '\'']);
    let name = word.strip_prefix("--")?;
    let name: String = name
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    let name = name.trim_end_matches('-');
    (name.chars().next().is_some_and(|c| c.is_ascii_lowercase())).then(|| format!("--{name}"))
}

/// Inline code spans: (byte offset, content).
fn code_spans(text: &str) -> Vec<(usize, &str)> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|b| **b == b'`').count();
        let fence = &text[i..i + run];
        let body = i + run;
        let mut j = body;
        let mut end = None;
        while let Some(found) = text[j..].find(fence) {
            let at = j + found;
            let len = bytes[at..].iter().take_while(|b| **b == b'`').count();
            if len == run {
                end = Some(at);
                break;
            }
            j = at + len;
        }
        match end {
            Some(at) => {
                spans.push((i, text[body..at].trim()));
                i = at + run;
            }
            None => i = body,
        }
    }
    spans
}

/// Targets of `[text](target)` outside code spans: (byte offset, target).
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let spans: Vec<(usize, usize)> = code_spans(text)
        .iter()
        .map(|(at, s)| (*at, *at + s.len() + 2))
        .collect();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("](") {
        let at = from + found;
        from = at + 2;
        if spans.iter().any(|(a, b)| (*a..*b).contains(&at)) {
            continue;
        }
        if let Some(close) = text[from..].find(')') {
            let target = text[from..from + close].trim();
            if !target.is_empty() && !target.contains(char::is_whitespace) {
                out.push((at, target.to_string()));
            }
        }
    }
    out
}

/// The long flags of a `--help` text: those its option lines declare.
pub fn help_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .flat_map(|l| {
            l.split([' ', ','])
                .take_while(|w| w.is_empty() || w.starts_with('-') || w.starts_with('<'))
                .filter_map(flag_in)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The subcommands a `--help` text lists under `Commands:`.
pub fn help_subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// `binary [subcommand] --help`, which must succeed.
fn help(binary: &Path, subcommand: &[&str]) -> String {
    let out = std::process::Command::new(binary)
        .args(subcommand)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    assert!(
        out.status.success(),
        "{} {subcommand:?} --help: {}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// Whether `flag` is written in `text` as a word (not as the start of a
/// longer flag).
fn text_has_flag(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(at, _)| {
        let next = text[at + flag.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

/// What the pages are checked against.
#[derive(Debug, Default)]
pub struct Known {
    /// `dra-plugin run` → its long flags, from `--help`.
    pub commands: BTreeMap<String, BTreeSet<String>>,
    /// Script path → its text.
    pub scripts: BTreeMap<String, String>,
}

impl Known {
    /// Every `scripts/*.sh` of the repository.
    pub fn with_scripts(repo: &Path) -> std::io::Result<Known> {
        let mut known = Known::default();
        for entry in std::fs::read_dir(repo.join("scripts"))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "sh") {
                let name = format!("scripts/{}", path.file_name().unwrap().to_string_lossy());
                known.scripts.insert(name, std::fs::read_to_string(&path)?);
            }
        }
        Ok(known)
    }

    /// The `--help` of a program and of each of its subcommands.
    pub fn add_program(&mut self, program: &str, binary: &Path) {
        let top = help(binary, &[]);
        for sub in help_subcommands(&top) {
            let flags = help_flags(&help(binary, &[&sub]));
            self.commands.insert(format!("{program} {sub}"), flags);
        }
        self.commands.insert(program.to_string(), help_flags(&top));
    }

    fn has_program(&self, program: &str) -> bool {
        self.commands
            .keys()
            .any(|c| c.split(' ').next() == Some(program))
    }

    /// Every problem of the pages: flags, and relative links when `links`.
    pub fn problems(&self, repo: &Path, links: bool) -> Vec<String> {
        let pages = pages(repo).expect("README.md and docs/");
        let mut out = Vec::new();
        for page in &pages {
            let (flags, page_links) = read_page(page);
            out.extend(flags.iter().filter_map(|m| self.problem(m)));
            if links {
                out.extend(
                    page_links
                        .iter()
                        .filter_map(|l| link_problem(repo, &pages, l)),
                );
            }
        }
        out
    }

    /// What is wrong with one mention, if anything. A mention of a program
    /// whose help is not known here is not judged (`None`).
    pub fn problem(&self, mention: &FlagMention) -> Option<String> {
        let FlagMention {
            page,
            line,
            flag,
            owner,
        } = mention;
        let place = format!("{}:{line}: {flag}", page.display());
        match owner {
            Owner::Command(command) => {
                let program = command.split(' ').next().unwrap_or(command);
                if !self
                    .commands
                    .keys()
                    .any(|c| c.split(' ').next() == Some(program))
                {
                    return None;
                }
                match self.commands.get(command) {
                    None => Some(format!("{place}: there is no command `{command}`")),
                    Some(flags) if !flags.contains(flag) => {
                        Some(format!("{place}: `{command} --help` has no such flag"))
                    }
                    Some(_) => None,
                }
            }
            Owner::AnyOf(commands) => {
                if commands.iter().any(|c| !self.commands.contains_key(c)) {
                    let unknown: Vec<_> = commands
                        .iter()
                        .filter(|c| !self.commands.contains_key(*c))
                        .collect();
                    let programs_here: BTreeSet<_> = self
                        .commands
                        .keys()
                        .filter_map(|c| c.split(' ').next())
                        .collect();
                    if unknown
                        .iter()
                        .all(|c| !programs_here.contains(c.split(' ').next().unwrap_or(c)))
                    {
                        return None;
                    }
                    return Some(format!(
                        "{place}: the section names unknown commands {unknown:?}"
                    ));
                }
                let found = commands.iter().any(|c| self.commands[c].contains(flag));
                (!found).then(|| format!("{place}: not a flag of any of {commands:?}"))
            }
            Owner::Script(script) => match self.scripts.get(script) {
                None => Some(format!("{place}: there is no script {script}")),
                Some(text) if !text_has_flag(text, flag) => {
                    Some(format!("{place}: {script} never mentions it"))
                }
                Some(_) => None,
            },
            Owner::Unsaid => {
                if DAEMONS.iter().any(|d| !self.has_program(d)) {
                    return None;
                }
                let known = self.commands.values().any(|f| f.contains(flag))
                    || self.scripts.values().any(|t| text_has_flag(t, flag));
                (!known).then(|| format!("{place}: no command or script of the repository has it"))
            }
        }
    }
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces
/// as dashes.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c.to_lowercase().next().unwrap_or(c)),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings (duplicates numbered as
/// GitHub does).
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_code = !in_code;
        }
        if in_code || !is_heading(trimmed) {
            continue;
        }
        let base = anchor(trimmed.trim_start_matches('#'));
        let count = seen.entry(base.clone()).or_insert(0);
        out.insert(match *count {
            0 => base.clone(),
            n => format!("{base}-{n}"),
        });
        *count += 1;
    }
    out
}

/// What is wrong with a relative link, if anything: a file that does not
/// exist, a path out of the repository, or a heading its page lacks.
pub fn link_problem(repo: &Path, pages: &[Page], link: &Link) -> Option<String> {
    let place = format!(
        "{}:{}: link {}",
        link.page.display(),
        link.line,
        link.target
    );
    let (path, fragment) = match link.target.split_once('#') {
        Some((p, f)) => (p, Some(f)),
        None => (link.target.as_str(), None),
    };
    let file = if path.is_empty() {
        link.page.clone()
    } else {
        let joined = link.page.parent().unwrap_or(Path::new("")).join(path);
        match normalize(&joined) {
            Some(p) => p,
            None => return Some(format!("{place}: leaves the repository")),
        }
    };
    if !repo.join(&file).exists() {
        return Some(format!("{place}: {} does not exist", file.display()));
    }
    let fragment = fragment.filter(|f| !f.is_empty())?;
    let text = match pages.iter().find(|p| p.path == file) {
        Some(page) => page.text.clone(),
        None if file.extension().is_some_and(|e| e == "md") => {
            std::fs::read_to_string(repo.join(&file)).unwrap_or_default()
        }
        None => return None,
    };
    (!anchors(&text).contains(fragment))
        .then(|| format!("{place}: {} has no heading #{fragment}", file.display()))
}

/// `docs/user/../performance.md` → `docs/performance.md`; `None` above the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(text: &str) -> Page {
        Page {
            path: PathBuf::from("docs/user/x.md"),
            text: text.to_string(),
        }
    }

    fn owners(text: &str) -> Vec<(String, Owner)> {
        read_page(&page(text))
            .0
            .into_iter()
            .map(|m| (m.flag, m.owner))
            .collect()
    }

    #[test]
    fn code_lines_name_their_command() {
        let text = "```sh\ndra-plugin run --node-name x \\\n  --state-dir /s\n\
                    kubectl -n d exec p -c dra-plugin -- /usr/bin/dra-plugin inspect --watch\n\
                    nri-plugin --nri-socket=/r # --not-this\n\
                    cargo test --workspace\n\
                    scripts/perf.sh --quick\n```\n";
        let run = Owner::Command("dra-plugin run".into());
        assert_eq!(
            owners(text),
            vec![
                ("--node-name".into(), run.clone()),
                ("--state-dir".into(), run),
                (
                    "--watch".into(),
                    Owner::Command("dra-plugin inspect".into())
                ),
                ("--nri-socket".into(), Owner::Command("nri-plugin".into())),
                ("--quick".into(), Owner::Script("scripts/perf.sh".into())),
            ]
        );
    }

    #[test]
    fn spans_take_the_section_or_their_command() {
        let text = "`--a` and `cargo bench --bench x`\n\n<!-- flags: nri-plugin -->\n\
                    | `--b` | `dra-plugin slices --c` |\n\n## next\n`--d`, `demo.sh\n--e`\n";
        assert_eq!(
            owners(text),
            vec![
                ("--a".into(), Owner::Unsaid),
                ("--b".into(), Owner::AnyOf(vec!["nri-plugin".into()])),
                ("--c".into(), Owner::Command("dra-plugin slices".into())),
                ("--d".into(), Owner::Unsaid),
                ("--e".into(), Owner::Script("scripts/demo.sh".into())),
            ]
        );
    }

    #[test]
    fn help_lists_its_option_lines_only() {
        let help = "Run it\n\nUsage: x [OPTIONS]\n\nCommands:\n  run   Run\n  help  Print\n\n\
                    Options:\n      --config <CONFIG>\n          YAML; see --other\n  -h, --help\n\
                    --mixed-allocation-mode[=<MIXED>]\n";
        let flags: Vec<_> = help_flags(help).into_iter().collect();
        assert_eq!(flags, ["--config", "--help", "--mixed-allocation-mode"]);
        assert_eq!(help_subcommands(help), ["run"]);
    }

    #[test]
    fn a_misspelt_flag_is_a_problem() {
        let mut known = Known::default();
        known.commands.insert(
            "dra-plugin run".into(),
            ["--min-shared-cpus".to_string()].into(),
        );
        let mention = |flag: &str, owner: Owner| FlagMention {
            page: "README.md".into(),
            line: 3,
            flag: flag.into(),
            owner,
        };
        let run = Owner::Command("dra-plugin run".into());
        assert_eq!(
            known.problem(&mention("--min-shared-cpus", run.clone())),
            None
        );
        assert_eq!(
            known.problem(&mention("--min-shared-cpu", run)).as_deref(),
            Some("README.md:3: --min-shared-cpu: `dra-plugin run --help` has no such flag")
        );
        // nri-plugin's help is not known here: not judged.
        assert_eq!(known.problem(&mention("--x", Owner::Unsaid)), None);
        assert_eq!(
            known.problem(&mention("--x", Owner::Command("nri-plugin".into()))),
            None
        );
        known
            .commands
            .insert("nri-plugin".into(), ["--align-memory".to_string()].into());
        assert!(known.problem(&mention("--x", Owner::Unsaid)).is_some());
        assert_eq!(
            known.problem(&mention("--align-memory", Owner::Unsaid)),
            None
        );
    }

    #[test]
    fn anchors_are_githubs() {
        assert_eq!(
            anchor("Placement (`--allocation-policy`)"),
            "placement---allocation-policy"
        );
        assert_eq!(
            anchor("Opaque cpuset config (the upstream driver's `v1alpha1`)"),
            "opaque-cpuset-config-the-upstream-drivers-v1alpha1"
        );
        let text = "# A\n```\n# not\n```\n## A\n";
        let found: Vec<_> = anchors(text).into_iter().collect();
        assert_eq!(found, ["a", "a-1"]);
    }

    #[test]
    fn links_outside_code_spans() {
        let (_, links) = read_page(&page(
            "See [a](../b.md#c) and `[x](y)`\n[web](https://e.org) [top](#t)\n",
        ));
        let targets: Vec<_> = links.iter().map(|l| (l.line, l.target.as_str())).collect();
        assert_eq!(targets, [(1, "../b.md#c"), (2, "#t")]);
        assert_eq!(
            normalize(Path::new("docs/user/../x.md")),
            Some(PathBuf::from("docs/x.md"))
        );
        assert_eq!(normalize(Path::new("../x")), None);
    }
}
