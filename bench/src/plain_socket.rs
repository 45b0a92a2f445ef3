//! The plain socket the KV benchmarks compare with: the same blocks written over loopback TCP
//! (`write_all` per block, `read_exact` into a reused buffer, an 8-byte ack per transfer), so a
//! ratio says what the KV transport (framing, checksums, pooled connections) costs over the
//! kernel's copy alone.

use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A connected pair of loopback sockets, reused across runs.
#[derive(Debug)]
pub struct PlainPath {
    writer: TcpStream,
    reader: Option<TcpStream>,
    block_bytes: usize,
}

impl PlainPath {
    /// A connected pair (TCP_NODELAY on both) for blocks of at most `block_bytes`.
    pub async fn new(block_bytes: usize) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let writer = TcpStream::connect(listener.local_addr()?).await?;
        let (reader, _) = listener.accept().await?;
        writer.set_nodelay(true)?;
        reader.set_nodelay(true)?;
        Ok(Self {
            writer,
            reader: Some(reader),
            block_bytes,
        })
    }

    /// Sends `blocks` `transfers` times, each transfer acknowledged; the time from the first
    /// byte written to the last ack read. Every block must be `block_bytes` long.
    pub async fn run<B: AsRef<[u8]>>(
        &mut self,
        blocks: &[B],
        transfers: usize,
    ) -> anyhow::Result<Duration> {
        anyhow::ensure!(
            blocks.iter().all(|b| b.as_ref().len() == self.block_bytes),
            "every block must be {} bytes",
            self.block_bytes
        );
        let mut reader = self.reader.take().context("reader in use")?;
        let n = blocks.len();
        let block_bytes = self.block_bytes;
        let start = Instant::now();
        let read = tokio::spawn(async move {
            let mut buf = vec![0u8; block_bytes];
            for _ in 0..transfers {
                for _ in 0..n {
                    reader.read_exact(&mut buf).await?;
                }
                reader.write_all(&[1u8; 8]).await?;
            }
            anyhow::Ok(reader)
        });
        for _ in 0..transfers {
            for block in blocks {
                self.writer.write_all(block.as_ref()).await?;
            }
            let mut ack = [0u8; 8];
            self.writer.read_exact(&mut ack).await?;
        }
        let elapsed = start.elapsed();
        self.reader = Some(read.await??);
        Ok(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn blocks_cross_and_each_transfer_is_acknowledged() {
        let mut path = PlainPath::new(4096).await.expect("path");
        let blocks = vec![vec![7u8; 4096]; 3];
        path.run(&blocks, 2).await.expect("run");
        path.run(&blocks, 1).await.expect("the pair is reused");
        let short = vec![vec![7u8; 100]];
        assert!(path.run(&short, 1).await.is_err());
    }
}
