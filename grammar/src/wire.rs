//! A format on the wire: `dolphin.v1.StructuredOutput`.

use dolphin_proto::v1;
use dolphin_proto::v1::structured_output::Format as Wire;

use crate::error::GrammarError;
use crate::format::Format;

impl Format {
    /// The format a request's `structured` field names; one without a format, or
    /// `json_object: false`, is refused (absence is how a request asks for free text).
    pub fn from_wire(w: &v1::StructuredOutput) -> Result<Format, GrammarError> {
        let invalid = |field: &'static str, message: &str| GrammarError::Invalid {
            field,
            message: message.into(),
        };
        Ok(match &w.format {
            Some(Wire::JsonSchema(s)) => Format::JsonSchema(s.clone()),
            Some(Wire::JsonObject(true)) => Format::JsonObject,
            Some(Wire::JsonObject(false)) => {
                return Err(invalid(
                    "json_object",
                    "json_object must be true (leave structured out for free text)",
                ));
            }
            Some(Wire::Regex(r)) => Format::Regex(r.clone()),
            Some(Wire::Choice(c)) => Format::Choice(c.options.clone()),
            Some(Wire::Grammar(g)) => Format::Lark(g.clone()),
            None => {
                return Err(invalid(
                    "structured",
                    "structured names no format (json_schema, json_object, regex, choice or grammar)",
                ));
            }
        })
    }

    /// The wire form of this format.
    pub fn to_wire(&self) -> v1::StructuredOutput {
        let format = match self {
            Format::JsonSchema(s) => Wire::JsonSchema(s.clone()),
            Format::JsonObject => Wire::JsonObject(true),
            Format::Regex(r) => Wire::Regex(r.clone()),
            Format::Choice(options) => Wire::Choice(v1::Choices {
                options: options.clone(),
            }),
            Format::Lark(g) => Wire::Grammar(g.clone()),
        };
        // Where the format starts is the router's to say (`after_tokens`), not the format's.
        v1::StructuredOutput {
            format: Some(format),
            after_tokens: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_goes_over_the_wire_and_back() {
        for f in [
            Format::JsonSchema("{}".into()),
            Format::JsonObject,
            Format::Regex("a+".into()),
            Format::Choice(vec!["x".into(), "y".into()]),
            Format::Lark("start: \"a\"".into()),
        ] {
            assert_eq!(Format::from_wire(&f.to_wire()), Ok(f));
        }
        assert!(Format::from_wire(&v1::StructuredOutput::default()).is_err());
        assert!(
            Format::from_wire(&v1::StructuredOutput {
                format: Some(Wire::JsonObject(false)),
                ..Default::default()
            })
            .is_err()
        );
    }
}
