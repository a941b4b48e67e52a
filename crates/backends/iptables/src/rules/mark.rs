//! The masquerade mark as a rule argument: written as upstream writes it (`0x00004000`),
//! since `iptables-save` must read the same whichever proxy wrote the rules.

use crate::ruleset::Arg;

/// The masquerade mark, spelled as upstream writes it (`0x00004000`).
#[derive(Clone, Copy, Debug)]
pub struct Mark(pub u32);

impl crate::ruleset::sealed::Sealed for Mark {}

impl Arg for Mark {
    fn push_to(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(out, "{:#010x}", self.0);
    }
}

/// `<mark>/<mark>`: the mark match with its mask.
pub struct MarkWithMask(pub Mark);

impl crate::ruleset::sealed::Sealed for MarkWithMask {}

impl Arg for MarkWithMask {
    fn push_to(&self, out: &mut String) {
        self.0.push_to(out);
        out.push('/');
        self.0.push_to(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::IptablesOptions;
    use crate::ruleset::Rule;

    #[test]
    fn mark_is_written_as_options_spell_it() {
        let opts = IptablesOptions::default();
        let rule = Rule::builder()
            .arg(Mark(opts.masquerade_mark_value()))
            .arg(MarkWithMask(Mark(opts.masquerade_mark_value())))
            .build();
        let mark = opts.masquerade_mark();
        assert_eq!(rule.restore_text(), format!("{mark} {mark}/{mark}"));
    }
}
