"""The slim server: host tables, compiled graphs, the OpenAI API."""
