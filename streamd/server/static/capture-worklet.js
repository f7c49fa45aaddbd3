// AudioWorklet processor: microphone samples (float, any channel count) -> blocks of 16-bit
// little-endian mono PCM, posted to the page, which sends them as binary websocket messages.
'use strict';

class PcmCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.size = options.processorOptions.blockSize;
    this.start();
  }

  start() {
    this.block = new DataView(new ArrayBuffer(2 * this.size));
    this.filled = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (channels.length === 0) return true;  // not connected yet
    for (let i = 0; i < channels[0].length; i++) {
      let x = 0;
      for (const channel of channels) x += channel[i];
      x /= channels.length;
      // the server divides s16le samples by 32768
      this.block.setInt16(2 * this.filled, Math.max(-32768, Math.min(32767, Math.round(x * 32768))), true);
      if (++this.filled === this.size) {
        this.port.postMessage(this.block.buffer, [this.block.buffer]);
        this.start();
      }
    }
    return true;
  }
}

registerProcessor('pcm-capture', PcmCapture);
