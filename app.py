"""sixbit Gradio demo (placeholder until the app lands: issue 5)."""

import gradio as gr

with gr.Blocks() as demo:
    gr.Markdown("# sixbit\nPlaceholder: the 6Bit-Diffusion demo is being built.")

if __name__ == "__main__":
    demo.launch()
