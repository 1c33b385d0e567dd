// Starts dynalite's own command line (node_modules/dynalite/cli.js, same arguments) and keeps
// it serving when a client drops a connection in the middle of a request: dynalite rethrows a
// request's 'error' event (index.js), which would otherwise end the process and with it every
// test still running. Any other uncaught error still ends it.
'use strict'

const dropped = new Set(['ECONNRESET', 'EPIPE', 'ECONNABORTED', 'ERR_STREAM_PREMATURE_CLOSE'])

process.on('uncaughtException', (err) => {
  if (err && (dropped.has(err.code) || err.message === 'aborted')) {
    console.error(`dynalite: a client dropped a request (${err.code || err.message}); still serving`)
    return
  }
  console.error(err)
  process.exit(1)
})

require('dynalite/cli.js')
