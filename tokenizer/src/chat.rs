//! Chat templates: the model's own Jinja template (`tokenizer.chat_template`), rendered with
//! minijinja configured as Hugging Face `transformers` configures Jinja2 (`trim_blocks`,
//! `lstrip_blocks`, `raise_exception`, `bos_token`/`eos_token` in the context), so the prompt is
//! the one the model was trained on, default system message included.

use std::collections::BTreeMap;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};

use crate::error::TokenizerError;

/// ChatML, for models whose file carries no template. Unlike SmolLM2's own template it adds no
/// default system message.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Name of the one template in the environment (no extension: no auto-escaping).
const NAME: &str = "chat";

/// One chat message to render into a prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// "system", "user", "assistant", ...
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts templates see under those
    /// names (empty when the model has none).
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks; many templates rely on them
        // to drop the newlines around {% %} tags.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(TokenizerError::ChatTemplate)?;
        env.set_syntax(syntax);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned(NAME, source.to_string())
            .map_err(TokenizerError::ChatTemplate)?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The built-in ChatML template ([`CHATML_TEMPLATE`]).
    pub fn chatml() -> ChatTemplate {
        // A constant template; the unit tests render it.
        Self::new(CHATML_TEMPLATE, "", "").expect("the ChatML template compiles")
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// answer begins.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let map: BTreeMap<String, Value> = [
                    ("role".to_string(), Value::from(m.role.as_str())),
                    ("content".to_string(), Value::from(m.content.as_str())),
                ]
                .into();
                Value::from(map)
            })
            .collect();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(TokenizerError::ChatTemplate)?;
        tmpl.render(ctx).map_err(TokenizerError::ChatTemplate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template, as stored in its GGUF.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    const DEFAULT_SYSTEM: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

    #[test]
    fn smollm2_adds_its_default_system_message() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let out = t.render(&[ChatMessage::new("user", "Hi!")], true).unwrap();
        assert_eq!(
            out,
            format!("{DEFAULT_SYSTEM}<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
        );
        let out = t.render(&[ChatMessage::new("user", "Hi!")], false).unwrap();
        assert_eq!(
            out,
            format!("{DEFAULT_SYSTEM}<|im_start|>user\nHi!<|im_end|>\n")
        );
    }

    #[test]
    fn smollm2_keeps_a_given_system_message_and_all_roles() {
        let t = ChatTemplate::new(SMOLLM2, "", "").unwrap();
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "2+2?"),
            ChatMessage::new("assistant", "4"),
            ChatMessage::new("user", "{{ not a tag }} and 'quotes' \"too\""),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n4<|im_end|>\n\
             <|im_start|>user\n{{ not a tag }} and 'quotes' \"too\"<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(t.render(&[], true).unwrap(), "<|im_start|>assistant\n");
    }

    #[test]
    fn chatml_fallback() {
        let t = ChatTemplate::chatml();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "hi")], true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(t.source(), CHATML_TEMPLATE);
    }

    #[test]
    fn transformers_whitespace_control_and_context() {
        let src = "{% for m in messages %}\n  {{ bos_token }}{{ m.content }}\n{% endfor %}{{ eos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t
            .render(
                &[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")],
                false,
            )
            .unwrap();
        assert_eq!(out, "  <s>a\n  <s>b\n</s>");
    }

    #[test]
    fn raise_exception_and_syntax_errors_are_errors() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "x")], false).unwrap(),
            "ok"
        );
        let err = t
            .render(&[ChatMessage::new("assistant", "x")], false)
            .unwrap_err();
        let TokenizerError::ChatTemplate(e) = &err else {
            panic!("{err:?}")
        };
        assert!(e.to_string().contains("first must be user"), "{e}");
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(TokenizerError::ChatTemplate(_))
        ));
    }
}
