"""The Gradio front end of the sixbit demo (layout, figures, validation, session state; no model code)."""
