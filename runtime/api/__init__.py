"""The OpenAI API: request schemas, routes, chat prompts and replies, response bodies and errors."""
