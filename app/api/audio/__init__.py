"""OpenAI's speech to text (`/v1/audio/transcriptions`, `/translations`)."""
